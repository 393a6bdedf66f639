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
