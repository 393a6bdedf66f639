#!/usr/bin/env bash
# Python package benchmarks: our package (bindings/python) against the
# original Rust-based prosody-events from PyPI, same script
# (bench/python/bench_python.py), same broker, same run. Prints
# "bench NAME value unit [ratio=R] [notes]" lines on stdout (bench/run.sh
# collects them); the packages' own logging goes to build-bench/python-bench.log.
#
#   bench/python/run.sh [BUILD_DIR]      BUILD_DIR holds bench/bench_fill (build-release)
#
# Needs Kafka on 127.0.0.1:9094 (scripts/services/kafka start). The original
# also needs Cassandra outside mock mode (scripts/services/cassandra start):
# without it the original's rows are skipped and ours runs without
# cassandra_nodes.
#
# Virtualenvs, kept between runs under build-bench/ (gitignored):
#   venv-orig  pip install prosody-events (latest, or PROSODY_ORIG_VERSION)
#   venv-ours  pip install bindings/python (reinstalled every run)
# Environment (optional):
#   PROSODY_ORIG_VERSION   pin the original, e.g. 0.3.0 (the release the spec documents)
#   BENCH_PY_RECORDS       records per consume run (200000)
#   BENCH_PY_SECONDS       consume window bound after the first record (30)
#   BENCH_PY_SEND_SECONDS  send duration bound (20); BENCH_PY_SEND_COUNT (100000)
#   BENCH_PY_ONLY          ours|original: run one side only
#   BENCH_PY_OURS_SRC      our package's source directory (bindings/python)
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="${1:-build-release}"
build="$(cd "$build" 2>/dev/null && pwd || echo "$build")" # relative to the caller's directory
venvs="$root/build-bench"
log="$venvs/python-bench.log"
records="${BENCH_PY_RECORDS:-200000}"
seconds="${BENCH_PY_SECONDS:-30}"
send_seconds="${BENCH_PY_SEND_SECONDS:-20}"
send_count="${BENCH_PY_SEND_COUNT:-100000}"
only="${BENCH_PY_ONLY:-}"
ours_src="${BENCH_PY_OURS_SRC:-$root/bindings/python}"
mkdir -p "$venvs"
: >"$log"
note() { echo "$*" >&2; echo "== $*" >>"$log"; }

if ! python3 "$root/scripts/services/kafka_check.py" --timeout 3 >/dev/null 2>&1; then
  echo "== python packages: skipped (no Kafka on 127.0.0.1:9094; scripts/services/kafka start) =="
  exit 0
fi
if [ ! -x "$build/bench/bench_fill" ]; then
  echo "== python packages: skipped ($build/bench/bench_fill not built; make bench) =="
  exit 0
fi
cassandra=127.0.0.1:9042
if ! python3 "$root/scripts/services/cql_check.py" --timeout 3 >/dev/null 2>&1; then
  cassandra=""
fi

# venv NAME: creates build-bench/NAME once.
venv() {
  local v="$venvs/$1"
  if [ ! -x "$v/bin/python" ]; then python3 -m venv "$v" >>"$log" 2>&1 || return 1; fi
  echo "$v"
}

orig_py="" ours_py="" orig_why="" ours_why=""
if [ "$only" != ours ]; then
  if [ -z "$cassandra" ]; then
    orig_why="no Cassandra on 127.0.0.1:9042, which the original needs outside mock mode"
  elif v=$(venv venv-orig) &&
      "$v/bin/pip" install -q --upgrade "prosody-events${PROSODY_ORIG_VERSION:+==$PROSODY_ORIG_VERSION}" >>"$log" 2>&1; then
    orig_py="$v/bin/python"
  elif [ -n "${v:-}" ] && "$v/bin/python" -c 'import prosody' 2>/dev/null; then
    orig_py="$v/bin/python" # PyPI unreachable: the copy installed before
    note "python: pip install prosody-events failed; using the installed copy"
  else
    orig_why="pip install prosody-events failed, see $log"
  fi
fi
if [ "$only" != original ]; then
  # Reinstalled every run (the package changes); --no-deps first so a stale
  # copy never survives, then once more to fetch any new dependencies.
  if v=$(venv venv-ours) &&
      "$v/bin/pip" install -q --force-reinstall --no-deps "$ours_src" >>"$log" 2>&1 &&
      "$v/bin/pip" install -q "$ours_src" >>"$log" 2>&1 &&
      (cd / && "$v/bin/python" -c 'from prosody import AdminClient, EventHandler, ProsodyClient') >>"$log" 2>&1; then
    ours_py="$v/bin/python"
  else
    ours_why="ours not built: pip install bindings/python failed, see $log"
  fi
fi
[ -n "$orig_py" ] && note "python: original $("$orig_py" -c 'from importlib.metadata import version; print(version("prosody-events"))') in $venvs/venv-orig"
[ -n "$ours_py" ] && note "python: ours in $venvs/venv-ours"
[ -n "$orig_why" ] && note "python: original skipped ($orig_why)"
[ -n "$ours_why" ] && note "python: $ours_why"

# run PY LABEL SUBCOMMAND ARGS...: the script's bench line, or nothing.
run() {
  local py="$1" label="$2" keyspace out
  shift 2
  keyspace="prosody_bench_$label"
  [ "$label" = original ] && keyspace="prosody_bench_original_$("$py" -c 'from importlib.metadata import version; print(version("prosody-events"))' | tr -c '0-9a-z\n' _)"
  echo "== $label: $*" >>"$log"
  out=$(cd "$root" && "$py" "$here/bench_python.py" "$@" --label "$label" \
        --cassandra "$cassandra" --cassandra-keyspace "$keyspace" 2>>"$log")
  if [ -z "$out" ]; then note "python: $label $1 failed (tail of $log):"; tail -n 5 "$log" >&2; fi
  echo "$out"
}

# scenario NAME UNIT EXTRA_NOTE ARGS...: the original's row, then ours with
# ratio = ours / original and the original's value and CPU as notes.
scenario() {
  local name="$1" unit="$2" extra="$3" o="" s="" ov oc ovr r ours_note
  shift 3
  note "python: $name ($*)"
  if [ -n "$orig_py" ]; then
    o=$(run "$orig_py" original "$@")
    echo "${o:-bench $name-original n/a $unit (failed, see $log)}"
  elif [ -n "$orig_why" ]; then
    echo "bench $name-original n/a $unit (skipped: $orig_why)"
  fi
  if [ -n "$ours_py" ]; then s=$(run "$ours_py" ours "$@"); fi
  if [ -z "$s" ]; then
    if [ -n "$ours_py" ]; then ours_note="ours failed, see $log"; else ours_note="${ours_why:-ours not run: BENCH_PY_ONLY=$only}"; fi
    echo "bench $name n/a $unit ($ours_note)${extra:+ $extra}"
    return
  fi
  set -- $s
  local v="$3" notes="${*:5}"
  if [ -n "$o" ]; then
    ov=$(echo "$o" | awk '{print $3}')
    oc=$(echo "$o" | tr ' ' '\n' | awk -F= '$1 == "cpu_us" {print $2}')
    r=$(awk -v a="$v" -v b="$ov" 'BEGIN {printf "%.2f", a / b}')
    ovr=$(echo "$o" | tr ' ' '\n' | awk -F= '$1 == "version" {print $2}')
    echo "bench $name $v $unit ratio=$r ${notes/ version=/ original=$ov original_cpu_us=$oc original_version=$ovr version=}${extra:+ $extra}"
  else
    echo "bench $name $v $unit $notes${extra:+ $extra} (original: $([ -n "$orig_py" ] && echo failed || echo "${orig_why:-not run}"))"
  fi
}

scenario python-consume-default records/s "" consume --records "$records" --max-seconds "$seconds"
scenario python-consume-wide records/s "target=20000" consume --records "$records" --max-seconds "$seconds" \
  --max-concurrency 1024 --max-uncommitted 4096
scenario python-consume-state records/s "target=ratio>=20" consume --records "$records" --max-seconds "$seconds" --state
scenario python-send sends/s "" send --tasks 100 --count "$send_count" --seconds "$send_seconds"
exit 0
