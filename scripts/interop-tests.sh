#!/usr/bin/env bash
# Interop tests against the ORIGINAL Rust-based Prosody, for the real tier of
# `make test` (scripts/run-tests.sh calls this after the Python real tier):
#   tests/interop/shared_group.py  one consumer of our Python package and one
#       of the original prosody-events (PyPI, pinned) share ONE consumer group
#       on a real Kafka; both must get partitions, lose no record across the
#       join and keep each key's order;
#   tests/interop/wire_records.py  each side's telemetry topic, failure topic
#       and sent records, read back and compared field by field (run with the
#       original's venv, which also gets confluent-kafka, pinned, to read
#       every header).
#
# Both packages import as `prosody`, so each has its own venv:
#   ours      ${PROSODY_PY_VENV:-build/python-venv}, built by
#             `scripts/python-tests.sh install` (skipped with --installed,
#             which scripts/run-tests.sh passes: it has just installed it)
#   original  ${PROSODY_ORIG_VENV:-build/original-venv}, made with
#             ${PYTHON:-python3} (3.11: PyPI serves a cp311 manylinux wheel),
#             with prosody-events==${PROSODY_ORIG_VERSION:-0.6.1} and
#             confluent-kafka==${PROSODY_INTEROP_KAFKA_VERSION:-2.16.2}
#
#   scripts/interop-tests.sh [--installed]
#
# Needs Kafka on 127.0.0.1:9094 and Cassandra on 127.0.0.1:9042: each is
# started here (scripts/services/SERVICE start, which also waits for one
# still starting) unless it answers or PROSODY_TEST_BOOTSTRAP /
# PROSODY_TEST_CASSANDRA is set, and is left running: this script never stops
# a service (scripts/run-tests.sh stops what it started itself). The original
# consumer's log goes to build/interop/. Every wait in the test is bounded by
# PROSODY_INTEROP_WAIT seconds (120).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
ours_venv="${PROSODY_PY_VENV:-$root/build/python-venv}"
orig_venv="${PROSODY_ORIG_VENV:-$root/build/original-venv}"
orig_version="${PROSODY_ORIG_VERSION:-0.6.1}"
installed=0
case "${1:-}" in
--installed) installed=1 ;;
"") ;;
*)
  echo "usage: scripts/interop-tests.sh [--installed]" >&2
  exit 2
  ;;
esac
up() { # up SERVICE: start it unless it answers; never stopped here
  if ! "$root/scripts/services/$1" status >/dev/null 2>&1; then
    "$root/scripts/services/$1" start || {
      echo "interop-tests: could not start $1" >&2
      exit 1
    }
  fi
}

t0=$(date +%s)
# The original, pinned, in its own venv (installed once, kept between runs).
if [ ! -x "$orig_venv/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$orig_venv"
fi
if ! "$orig_venv/bin/python" -c 'import sys, importlib.metadata as m; sys.exit(m.version("prosody-events") != sys.argv[1])' \
  "$orig_version" 2>/dev/null; then
  "$orig_venv/bin/pip" install -q --disable-pip-version-check "prosody-events==$orig_version"
fi
# The reader wire_records.py writes and reads raw records with (headers).
reader_version="${PROSODY_INTEROP_KAFKA_VERSION:-2.16.2}"
if ! "$orig_venv/bin/python" -c 'import sys, importlib.metadata as m; sys.exit(m.version("confluent-kafka") != sys.argv[1])' \
  "$reader_version" 2>/dev/null; then
  "$orig_venv/bin/pip" install -q --disable-pip-version-check "confluent-kafka==$reader_version"
fi
echo "interop-tests: the original prosody-events $orig_version is in $orig_venv"
# Ours.
if [ "$installed" = 0 ] || [ ! -x "$ours_venv/bin/python" ]; then
  PROSODY_PY_VENV="$ours_venv" "$root/scripts/python-tests.sh" install
fi

[ -n "${PROSODY_TEST_BOOTSTRAP:-}" ] || up kafka
[ -n "${PROSODY_TEST_CASSANDRA:-}" ] || up cassandra
"$ours_venv/bin/python" "$root/tests/interop/shared_group.py" \
  --original-python "$orig_venv/bin/python" --log-dir "$root/build/interop"
"$orig_venv/bin/python" "$root/tests/interop/wire_records.py" \
  --original-python "$orig_venv/bin/python" --ours-python "$ours_venv/bin/python" \
  --log-dir "$root/build/interop"
echo "interop-tests: passed in $(( $(date +%s) - t0 )) s"
