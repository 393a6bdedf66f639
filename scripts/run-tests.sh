#!/usr/bin/env bash
# Runs the test tiers for `make test`: unit and mock-cluster tests (C, then
# the Python and Node packages' suites), then the real tier (C, Python, the
# interop test with the original Prosody (scripts/interop-tests.sh: a
# consumer group shared by our Python package and PyPI's prosody-events),
# Node) against Apache Kafka on localhost:9094, Apache Cassandra on
# localhost:9042 and Jaeger (OTLP/HTTP 127.0.0.1:4318, query API
# 127.0.0.1:16686, for the span tests real.otel_jaeger.* and
# real.trace_chain.*; PROSODY_TEST_JAEGER=1 skips starting it), each
# started here unless it already runs, and stopped again if started here
# (logs stay in
# ${PROSODY_SERVICES_RUN:-/tmp/prosody-services}/<service>/logs).
#   scripts/run-tests.sh BUILD_DIR [all|real]
#   scripts/run-tests.sh BUILD_DIR cluster   the `cluster` label alone, against
#                        the three-node cluster of scripts/services/kafka-cluster
#                        (started here unless all three nodes answer)
#   scripts/run-tests.sh BUILD_DIR kafka4    the C real tier (label `real`) against
#                        Kafka 4 (scripts/services/kafka4, 127.0.0.1:9096, with
#                        KIP-848 consumer groups on), with PROSODY_TEST_KAFKA4=1,
#                        Cassandra and Jaeger as above; Kafka 4 is started here
#                        unless it answers. A Cassandra that already ran is
#                        someone else's: the tests that kill or restart it
#                        skip (PROSODY_TEST_CASSANDRA=1).
set -uo pipefail
build="${1:-build}"
tier="${2:-all}"
root="$(cd "$(dirname "$0")/.." && pwd)"
jobs="${JOBS:-2}"
rc=0
WHO=run-tests
# shellcheck source=services/ensure.sh
. "$root/scripts/services/ensure.sh"

t0=$(date +%s)
if [ "$tier" = cluster ]; then
  ensure kafka-cluster
  report="$(cd "$build" && pwd)/cluster-report.txt"
  : >"$report"
  PROSODY_CLUSTER_REPORT="$report" ctest --test-dir "$build" --output-on-failure -L cluster || rc=1
  cat "$report"
  echo "run-tests: cluster tier finished in $(( $(date +%s) - t0 )) s, $([ $rc = 0 ] && echo PASSED || echo FAILED)"
  exit $rc
fi
if [ "$tier" = kafka4 ]; then
  ensure kafka4
  if [ -z "${PROSODY_TEST_CASSANDRA:-}" ]; then
    ensure cassandra
    [[ " ${ensure_started[*]} " == *" cassandra "* ]] || export PROSODY_TEST_CASSANDRA=1
  fi
  [ -n "${PROSODY_TEST_JAEGER:-}" ] || ensure jaeger
  PROSODY_TEST_BOOTSTRAP=127.0.0.1:9096 PROSODY_TEST_KAFKA4=1 \
    ctest --test-dir "$build" --output-on-failure -j "$jobs" -L real || rc=1
  echo "run-tests: kafka4 tier finished in $(( $(date +%s) - t0 )) s, $([ $rc = 0 ] && echo PASSED || echo FAILED)"
  exit $rc
fi
# The real tier's services boot while the mock tiers run (they mostly wait):
# its `ensure` calls below then wait for these starts.
if [ "$tier" = all ]; then
  [ -n "${PROSODY_TEST_BOOTSTRAP:-}" ] || ensure_early kafka
  [ -n "${PROSODY_TEST_CASSANDRA:-}" ] || ensure_early cassandra
fi
py=0 # the Python package is built (its suite runs in both tiers)
if [ "$tier" = all ]; then
  ctest --test-dir "$build" --output-on-failure -j "$jobs" -L 'unit|mock' || rc=1
fi
if "$root/scripts/python-tests.sh" install; then
  py=1
  if [ "$tier" = all ]; then
    "$root/scripts/python-tests.sh" mock || rc=1
  fi
else
  echo "run-tests: the Python package did not build" >&2
  rc=1
fi
node=0 # the same for the Node package
if "$root/scripts/node-tests.sh" install; then
  node=1
  if [ "$tier" = all ]; then
    "$root/scripts/node-tests.sh" mock || rc=1
  fi
else
  echo "run-tests: the Node package did not build" >&2
  rc=1
fi

[ -n "${PROSODY_TEST_BOOTSTRAP:-}" ] || ensure kafka
[ -n "${PROSODY_TEST_CASSANDRA:-}" ] || ensure cassandra
[ -n "${PROSODY_TEST_JAEGER:-}" ] || ensure jaeger
ctest --test-dir "$build" --output-on-failure -j "$jobs" -L real || rc=1
if [ "$py" = 1 ]; then
  "$root/scripts/python-tests.sh" real || rc=1
  "$root/scripts/interop-tests.sh" --installed || rc=1
fi
if [ "$node" = 1 ]; then
  "$root/scripts/node-tests.sh" real || rc=1
fi

echo "run-tests: finished in $(( $(date +%s) - t0 )) s, $([ $rc = 0 ] && echo PASSED || echo FAILED)"
exit $rc
