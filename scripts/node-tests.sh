#!/usr/bin/env bash
# The Node package's suite (bindings/node/test), for `make test`.
#   scripts/node-tests.sh install      npm install in bindings/node (builds the addon)
#   scripts/node-tests.sh mock|real    run the suite in one tier
# The real tier expects Kafka on 127.0.0.1:9094 and Cassandra on
# 127.0.0.1:9042 (scripts/run-tests.sh starts them).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$root/bindings/node"
what="${1:?usage: node-tests.sh install|mock|real [node --test args]}"
shift

case "$what" in
install)
  cd "$dir"
  # `npm ci` follows package-lock.json exactly; the install script builds
  # libprosody (CMake, under build/) and the addon.
  npm ci --no-audit --no-fund --loglevel=error
  echo "node-tests: built $dir/build/Release/prosody.node"
  ;;
mock | real)
  cd "$dir"
  t0=$(date +%s)
  PROSODY_TEST_TIER="$what" node --test --test-concurrency=1 "$@" test/
  echo "node-tests: $what tier passed in $(( $(date +%s) - t0 )) s"
  ;;
*)
  echo "node-tests: unknown command $what" >&2
  exit 2
  ;;
esac
