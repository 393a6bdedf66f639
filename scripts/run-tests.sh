#!/usr/bin/env bash
# Runs the test tiers for `make test`: unit and mock-cluster tests, then the
# real tier against Apache Kafka on localhost:9094 (started here unless it
# already runs, and stopped again if started here; its logs stay in
# ${PROSODY_SERVICES_RUN:-/tmp/prosody-services}/kafka/logs for failed runs).
#   scripts/run-tests.sh BUILD_DIR [all|real]
set -uo pipefail
build="${1:-build}"
tier="${2:-all}"
root="$(cd "$(dirname "$0")/.." && pwd)"
jobs="${JOBS:-2}"
started=()
rc=0

cleanup() {
  for svc in "${started[@]}"; do
    "$root/scripts/services/$svc" stop || true
  done
}
trap cleanup EXIT

t0=$(date +%s)
if [ "$tier" = all ]; then
  ctest --test-dir "$build" --output-on-failure -j "$jobs" -L 'unit|mock' || rc=1
fi

if [ -z "${PROSODY_TEST_BOOTSTRAP:-}" ]; then
  if ! "$root/scripts/services/kafka" status >/dev/null 2>&1; then
    if "$root/scripts/services/kafka" start; then
      started+=(kafka)
    else
      echo "run-tests: could not start Kafka for the real tier" >&2
      exit 1
    fi
  fi
fi
ctest --test-dir "$build" --output-on-failure -j "$jobs" -L real || rc=1

echo "run-tests: finished in $(( $(date +%s) - t0 )) s, $([ $rc = 0 ] && echo PASSED || echo FAILED)"
exit $rc
