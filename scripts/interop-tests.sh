#!/usr/bin/env bash
# Interop tests against the ORIGINAL Rust-based Prosody (`make test-interop`;
# also part of the real tier of `make test`: scripts/run-tests.sh calls this
# after the Python real tier), each a program of tests/interop/:
#   keyspace.py      one keyspace and one topic used by both in turn: each
#                    side consumes what the other sent, the original starts
#                    on a keyspace ours created and ours on one it created,
#                    and neither applies a migration twice;
#   defer_dedup.py   a group moves original -> ours and ours -> original:
#                    the messages one side deferred are retried by the
#                    other, in order, once each, and the ids one side
#                    handled are duplicates for the other (the stores'
#                    shared tables);
#   timers.py        timers move with a consumer group between the two: a
#                    timer either side scheduled fires on the other, once, at
#                    its second, and scheduled()/unschedule see the other
#                    side's timers (original_timers.py is its original side);
#   shared_group.py  one consumer of ours and one of the original share ONE
#                    consumer group: both get partitions, no record is lost
#                    across the join, each key's order holds;
#   group_move.py    a group moves original -> ours -> original mid-topic
#                    while timers are pending and messages deferred: each
#                    timer fires once, at its time, on the next member; each
#                    deferred record is retried there; nothing is handled
#                    twice (dedup), key order holds;
#   rolling.py       a rolling upgrade under load: three members of the
#                    original replaced by ours one by one, 10 s apart, then
#                    rolled back: nothing lost, no timer twice or never;
#   keyed_state.py   keyed state moves with a group original -> ours ->
#                    original: each member reads every write the earlier
#                    ones committed (a value, a map, a deque per key);
#   published_state.py  published keyed state owned by one and read by the
#                    other, both ways: a client that subscribes to nothing
#                    reads, with client.state(subsystem, definition), every
#                    write the owning group committed and none it did not
#                    (a held write, a failed one), by every reader method;
#   wire_records.py  each side's telemetry topic, failure topic and sent
#                    records, read back and compared field by field (run
#                    with the original's venv, which also gets
#                    confluent-kafka, pinned, to read every header).
#
# Both packages import as `prosody`, so each has its own venv:
#   ours      ${PROSODY_PY_VENV:-build/python-venv}, built by
#             `scripts/python-tests.sh install` (skipped with --installed,
#             which scripts/run-tests.sh passes: it has just installed it)
#   original  ${PROSODY_ORIG_VENV:-build/original-venv}, made with
#             ${PYTHON:-python3} (3.11: PyPI serves a cp311 manylinux wheel),
#             with prosody-events==${PROSODY_ORIG_VERSION:-0.6.1} (the current
#             API and schema) and confluent-kafka==${PROSODY_INTEROP_KAFKA_VERSION:-2.16.2}
#   seed      ${PROSODY_SEED_VENV:-build/original-0.2.0-venv}, prosody-events
#             0.2.0 (the specification's API; its core knew 8 migrations)
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
seed_venv="${PROSODY_SEED_VENV:-$root/build/original-0.2.0-venv}"
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
# The original, pinned, in a venv of its own per version (installed once,
# kept between runs).
original() { # original VENV VERSION
  if [ ! -x "$1/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$1"
  fi
  if ! "$1/bin/python" -c 'import sys, importlib.metadata as m; sys.exit(m.version("prosody-events") != sys.argv[1])' \
    "$2" 2>/dev/null; then
    "$1/bin/pip" install -q --disable-pip-version-check "prosody-events==$2"
  fi
  echo "interop-tests: the original prosody-events $2 is in $1"
}
original "$orig_venv" "$orig_version"
# The reader wire_records.py writes and reads raw records with (headers).
reader_version="${PROSODY_INTEROP_KAFKA_VERSION:-2.16.2}"
if ! "$orig_venv/bin/python" -c 'import sys, importlib.metadata as m; sys.exit(m.version("confluent-kafka") != sys.argv[1])' \
  "$reader_version" 2>/dev/null; then
  "$orig_venv/bin/pip" install -q --disable-pip-version-check "confluent-kafka==$reader_version"
fi
original "$seed_venv" 0.2.0
# Ours, with cassandra-driver to read the keyspaces' bookkeeping.
if [ "$installed" = 0 ] || [ ! -x "$ours_venv/bin/python" ]; then
  PROSODY_PY_VENV="$ours_venv" "$root/scripts/python-tests.sh" install
fi
if ! "$ours_venv/bin/python" -c 'import cassandra' 2>/dev/null; then
  "$ours_venv/bin/pip" install -q --disable-pip-version-check "cassandra-driver==3.30.1"
fi

[ -n "${PROSODY_TEST_BOOTSTRAP:-}" ] || up kafka
[ -n "${PROSODY_TEST_CASSANDRA:-}" ] || up cassandra
rc=0
# The migrations a keyspace records: the original's files, which we ship.
migrations=$(find "$root/third_party/prosody-migrations" -name '*.cql' | wc -l)
"$ours_venv/bin/python" "$root/tests/interop/keyspace.py" --migrations "$migrations" \
  --original-migrations "$migrations" --original-python "$orig_venv/bin/python" \
  --log-dir "$root/build/interop" || rc=1
"$ours_venv/bin/python" "$root/tests/interop/keyspace.py" --migrations "$migrations" \
  --original-migrations 8 --original-python "$seed_venv/bin/python" \
  --log-dir "$root/build/interop" || rc=1
"$ours_venv/bin/python" "$root/tests/interop/defer_dedup.py" \
  --original-python "$orig_venv/bin/python" --log-dir "$root/build/interop" || rc=1
"$ours_venv/bin/python" "$root/tests/interop/timers.py" \
  --original-python "$orig_venv/bin/python" --log-dir "$root/build/interop" || rc=1
"$ours_venv/bin/python" "$root/tests/interop/shared_group.py" \
  --original-python "$orig_venv/bin/python" --log-dir "$root/build/interop" || rc=1
"$ours_venv/bin/python" "$root/tests/interop/group_move.py" \
  --python "$orig_venv/bin/python" --label original --python "$ours_venv/bin/python" --label ours \
  --python "$orig_venv/bin/python" --label original --log-dir "$root/build/interop" || rc=1
"$ours_venv/bin/python" "$root/tests/interop/rolling.py" --from-python "$orig_venv/bin/python" \
  --to-python "$ours_venv/bin/python" --log-dir "$root/build/interop" || rc=1
"$ours_venv/bin/python" "$root/tests/interop/keyed_state.py" \
  --python "$orig_venv/bin/python" --label original --python "$ours_venv/bin/python" --label ours \
  --python "$orig_venv/bin/python" --label original --log-dir "$root/build/interop" || rc=1
"$ours_venv/bin/python" "$root/tests/interop/published_state.py" \
  --original-python "$orig_venv/bin/python" --ours-python "$ours_venv/bin/python" \
  --log-dir "$root/build/interop" || rc=1
"$orig_venv/bin/python" "$root/tests/interop/wire_records.py" \
  --original-python "$orig_venv/bin/python" --ours-python "$ours_venv/bin/python" \
  --log-dir "$root/build/interop" || rc=1
[ "$rc" = 0 ] || {
  echo "interop-tests: FAILED after $(( $(date +%s) - t0 )) s" >&2
  exit 1
}
echo "interop-tests: passed in $(( $(date +%s) - t0 )) s"
