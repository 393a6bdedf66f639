#!/usr/bin/env bash
# Runs every benchmark in an optimised build and records the machine-
# readable lines ("bench NAME value unit ratio=...") in
# bench/results/latest.json. Usage: bench/run.sh BUILD_DIR
set -euo pipefail
build="${1:-build-release}"
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$here/results"
lines=$(mktemp); trap 'rm -f "$lines"' EXIT
echo "== produce throughput (embedded mock cluster) =="
"$build/bench/bench_produce" 200000 5 | tee -a "$lines"
echo "== consume throughput, no-op handler (embedded mock cluster) =="
"$build/bench/bench_consume" 200000 3 | tee -a "$lines"

# Store: our CQL client against the Python cassandra-driver (PyPI, in a
# cached virtualenv), the same prepared statements at the same concurrency
# against the same node, when a Cassandra node answers on localhost:9042.
if python3 "$here/../scripts/services/cql_check.py" --timeout 3 >/dev/null 2>&1; then
  echo "== store throughput: prepared INSERT/SELECT, 64 in flight (Cassandra) =="
  venv="${PROSODY_BENCH_VENV:-$HOME/.cache/prosody-bench-venv}"
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import cassandra' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q cassandra-driver
  fi
  ours=$("$build/bench/bench_store" 127.0.0.1:9042 prosody_bench 20000 64)
  theirs=$("$venv/bin/python" "$here/bench_store.py" 127.0.0.1 9042 prosody_bench 20000 64)
  for op in insert select; do
    o=$(echo "$ours" | awk -v k="${op}_ops_s" '$1 == k {print $2}')
    t=$(echo "$theirs" | awk -v k="${op}_ops_s" '$1 == k {print $2}')
    echo "bench store_${op} $o ops/s ratio=$(awk -v o="$o" -v t="$t" 'BEGIN {printf "%.2f", o / t}') python_driver=$t" | tee -a "$lines"
  done
else
  echo "== store throughput: skipped (no Cassandra on localhost:9042; scripts/services/cassandra start) =="
fi
python3 - "$lines" "$here/results/latest.json" <<'PY'
import json, platform, os, sys, time
rows = []
for line in open(sys.argv[1]):
    p = line.split()
    if len(p) >= 4 and p[0] == "bench":
        ratio = next((float(x.split("=")[1]) for x in p[4:] if x.startswith("ratio=")), None)
        rows.append({"name": p[1], "value": float(p[2]), "unit": p[3], "ratio": ratio})
doc = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
       "machine": {"cpus": os.cpu_count(), "kernel": platform.release()},
       "results": rows}
json.dump(doc, open(sys.argv[2], "w"), indent=2)
print("wrote", sys.argv[2])
PY
