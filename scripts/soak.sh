#!/usr/bin/env bash
# The soak for `make soak`: builds tests/soak/soak.c in build-soak
# (RelWithDebInfo), starts Apache Kafka (localhost:9094) and Apache
# Cassandra (localhost:9042) unless they already run (and stops again only
# those it started), and runs the soak for ${SOAK_MINUTES:-30} minutes.
# The markdown summary goes to build-soak/soak-summary.md (for
# docs/RELIABILITY.md); the exit status is the soak's.
#   scripts/soak.sh [BUILD_DIR]
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build-soak}"
minutes="${SOAK_MINUTES:-30}"
WHO=soak
# shellcheck source=services/ensure.sh
. "$root/scripts/services/ensure.sh"

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DPROSODY_WERROR=ON -DPROSODY_BENCH=OFF >/dev/null || exit 1
cmake --build "$build" -j "${JOBS:-2}" --target soak || exit 1

[ -n "${PROSODY_TEST_BOOTSTRAP:-}" ] || ensure kafka
[ -n "${PROSODY_TEST_CASSANDRA_NODES:-}" ] || ensure cassandra

"$build/tests/soak" "$minutes" "$build/soak-summary.md"
rc=$?
echo "soak: summary in $build/soak-summary.md, $([ $rc = 0 ] && echo PASSED || echo FAILED)"
exit $rc
