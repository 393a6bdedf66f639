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
# 200 000 records on the embedded mock cluster: its partitions keep only
# the last ~190 000 records each (the log start offset advances), so with
# 1 000 000 over 4 partitions the oldest are gone before they are read.
# The 1 000 000-record runs are against the real broker below.
for dist in uniform zipf; do
  echo "== consume throughput, no-op handler, 200 000 records, 1 000 keys ($dist; embedded mock cluster) =="
  "$build/bench/bench_consume" 200000 3 "$dist" | tee -a "$lines"
done
# The engine alone (issue 14's targets): the same with telemetry off.
for dist in uniform zipf; do
  echo "== consume throughput, telemetry off ($dist; embedded mock cluster) =="
  BENCH_TELEMETRY=off "$build/bench/bench_consume" 200000 3 "$dist" | tee -a "$lines"
done

# The per-record work floor: raw librdkafka plus the work prosody must do
# for each record (key check, copy, headers, dedup id and set, JSON check,
# the handler's call) on the polling thread, with no hand-off to a handler
# thread, against the raw consumer in the same run.
echo "== consume floor: raw librdkafka plus prosody's per-record work inline, 200 000 records (uniform; embedded mock cluster) =="
"$build/bench/bench_floor" 200000 3 | tee -a "$lines"

# Memory behind one blocked key: partition 0 stops behind it (and is
# paused in librdkafka) while the other partitions flow; the resident set
# at the end against after the first 50 000 records (target <= 1.25).
echo "== memory behind one blocked key, 200 000 records behind it (embedded mock cluster) =="
"$build/bench/bench_blocked" 200000 | tee -a "$lines"

# A second and then a third member join a group of one under a steady
# stream (200 records/s, 1 000 keys, 6 partitions, 1-second handlers), once
# eager (range) and once cooperative (cooperative-sticky, the default):
# records handled again, handlers cancelled, and the p99 pause of the
# partitions that did not move, per join; ratio = cooperative / eager. ~90 s.
echo "== rebalance: a member joins a busy group, eager against cooperative (embedded mock cluster) =="
"$build/bench/bench_rebalance" | tee -a "$lines"

# What the telemetry topic costs: the no-op consumer with it on (the
# default, as above) against off, in turn in one process.
echo "== consume throughput, telemetry on against off (uniform; embedded mock cluster) =="
BENCH_TELEMETRY=pair "$build/bench/bench_consume" 200000 3 uniform | tee -a "$lines"

# Keyed state's cost: a counter per key (a GET and a SET per record,
# stored with the success) against the no-op handler, in turn.
echo "== consume throughput with a keyed-state counter against the no-op handler (uniform; embedded mock cluster, memory store) =="
BENCH_STATE=pair "$build/bench/bench_consume" 200000 3 uniform | tee -a "$lines"

# One key failing for ever (transient, deferral off): the rate of the
# other three partitions, per mode, against raw librdkafka in the same run.
# Backpressure is per partition, so the poisoned key stops at most its own.
for mode in pipeline low-latency best-effort; do
  echo "== consume throughput of the healthy partitions while key-0000 fails for ever ($mode mode; embedded mock cluster) =="
  BENCH_POISON=$mode "$build/bench/bench_consume" 200000 3 uniform | tee -a "$lines"
done

# The Node package on the same workload as consume-noop-uniform (async
# no-op onMessage), against the C figure of this run.
echo "== node-consume: the Node package, async no-op onMessage, 200 000 records, 1 000 keys (uniform; embedded mock cluster) =="
if "$here/../scripts/node-tests.sh" install >/dev/null 2>&1; then
  c=$(awk '$2 == "consume-noop-uniform" {print $3}' "$lines")
  BENCH_C_RATE="$c" node "$here/node/bench_consume.js" 200000 3 | grep '^bench' | tee -a "$lines"
else
  echo "== node-consume: skipped (the Node package did not build: scripts/node-tests.sh install) =="
fi

# Latency at half the measured no-op throughput, against a raw consumer
# reading the same kind of stream.
noop=$(awk '$2 == "consume-noop-uniform" {print int($3)}' "$lines")
rate=$(( ${noop:-20000} / 2 ))
echo "== latency: steady stream at $rate records/s for 10 s (50% of the no-op throughput) =="
"$build/bench/bench_latency" "$rate" 10 raw | tee -a "$lines"
"$build/bench/bench_latency" "$rate" 10 | tee -a "$lines"
for q in p50 p99 p99.9; do
  r=$(awk -v a="latency-raw_$q" '$2 == a {print $3}' "$lines")
  p=$(awk -v a="latency_$q" '$2 == a {print $3}' "$lines")
  echo "bench latency_${q}_vs_raw $p ms ratio=$(awk -v p="$p" -v r="$r" 'BEGIN {printf "%.2f", p / r}') raw=${r}ms" | tee -a "$lines"
done

echo "== timers: 100 000 timers over 10 000 keys due within 10 s (memory store; one timer per key and second, so 1 000 keys cannot hold them) =="
"$build/bench/bench_timers" 100000 10000 10 | tee -a "$lines"
echo "== memory: 10 000 keys in flight (asynchronous handler holding every event) vs a raw consumer holding the records =="
"$build/bench/bench_memory" 10000 raw | tee -a "$lines"
mem=$("$build/bench/bench_memory" 10000 prosody)
raw=$(awk '$2 == "memory-raw-per-10k-keys" {print $3}' "$lines")
echo "$mem ratio=$(echo "$mem" | awk -v r="$raw" '{printf "%.2f", $3 / r}')" | tee -a "$lines"

# The consume scenario against the real broker, when one answers on
# localhost:9094 (scripts/services/kafka start).
if python3 "$here/../scripts/services/kafka_check.py" --timeout 3 >/dev/null 2>&1; then
  for dist in uniform zipf; do
    echo "== consume throughput, 1 000 000 records, against Apache Kafka on localhost:9094 ($dist) =="
    BENCH_BOOTSTRAP=127.0.0.1:9094 "$build/bench/bench_consume" 1000000 3 "$dist" | tee -a "$lines"
    echo "== the same with telemetry off (the engine alone; $dist) =="
    BENCH_TELEMETRY=off BENCH_BOOTSTRAP=127.0.0.1:9094 "$build/bench/bench_consume" 1000000 3 "$dist" | tee -a "$lines"
  done
  echo "== consume floor against Apache Kafka: raw librdkafka plus prosody's per-record work inline, 1 000 000 records (uniform) =="
  BENCH_BOOTSTRAP=127.0.0.1:9094 "$build/bench/bench_floor" 1000000 3 | tee -a "$lines"
  # Kafka security: the same consumer over SASL_SSL (SCRAM-SHA-512, the
  # service's listener on localhost:9097) against PLAINTEXT, in turn.
  if python3 -c 'import socket; socket.create_connection(("127.0.0.1", 9097), 2)' 2>/dev/null; then
    echo "== consume throughput over SASL_SSL against PLAINTEXT, 1 000 000 records, Apache Kafka on localhost (uniform) =="
    BENCH_SECURITY=pair BENCH_BOOTSTRAP=127.0.0.1:9094 "$build/bench/bench_consume" 1000000 3 uniform | tee -a "$lines"
  else
    echo "== SASL_SSL: skipped (nothing on localhost:9097; restart scripts/services/kafka) =="
  fi
  if python3 -c 'import socket; socket.create_connection(("127.0.0.1", 9042), 2)' 2>/dev/null; then
    echo "== consume throughput with a keyed-state counter against the no-op handler, 100 000 records, Apache Kafka and Cassandra on localhost (uniform) =="
    BENCH_STATE=pair BENCH_BOOTSTRAP=127.0.0.1:9094 BENCH_CASSANDRA=127.0.0.1:9042 "$build/bench/bench_consume" 100000 3 uniform | tee -a "$lines"
  else
    echo "== keyed state on Cassandra: skipped (nothing on localhost:9042; scripts/services/cassandra start) =="
  fi
  echo "== memory behind one blocked key, 500 000 records behind it, against Apache Kafka (telemetry off) =="
  BENCH_TELEMETRY=off BENCH_BOOTSTRAP=127.0.0.1:9094 "$build/bench/bench_blocked" 500000 | tee -a "$lines"
  echo "== rebalance: a member joins a busy group, eager against cooperative, against Apache Kafka =="
  BENCH_BOOTSTRAP=127.0.0.1:9094 "$build/bench/bench_rebalance" | tee -a "$lines"
  # Our Python package against the original prosody-events (PyPI), the same
  # script under each, in virtualenvs under build-bench/. The original needs
  # Cassandra as well (bench/python/run.sh skips it without one).
  echo "== Python packages: bindings/python vs the original prosody-events, no-op consume (defaults; max_concurrency=1024 max_uncommitted=4096) and send, Kafka on localhost:9094 =="
  "$here/python/run.sh" "$build" | tee -a "$lines"
else
  echo "== real broker: skipped (no Kafka on localhost:9094; scripts/services/kafka start) =="
fi
# Hot key and failure storm (issue 15): the healthy keys' handler-start p99
# (intended-send-time based, as latency) at half the capacity of a 100 us
# handler, 1 000 keys, while key-0000 takes 100x the others' handler time
# (20 s), then while it fails for ever (transient; 8 s); ratios against a
# baseline run (8 s) in the same process. Each run also with the fair
# scheduler off (arrival order) and defer_enabled=false (-fifo). ~110 s.
echo "== hot key and failure storm: healthy keys' p99, 100 us handlers, 1 000 keys, key-0000 100x slower / failing for ever; fair scheduler and FIFO (embedded mock cluster) =="
"$build/bench/bench_hotkey" | tee -a "$lines"

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
  echo "== timers on the Cassandra store (same scenario; blocking prosody_schedule from 32 handler threads) =="
  BENCH_CASSANDRA=127.0.0.1:9042 "$build/bench/bench_timers" 100000 10000 10 |
    sed 's/^bench timers_/bench timers_cassandra_/' | tee -a "$lines"
  echo "== timers on the Cassandra store, scheduled with prosody_timer_async (same scenario) =="
  BENCH_TIMER_ASYNC=1 BENCH_CASSANDRA=127.0.0.1:9042 "$build/bench/bench_timers" 100000 10000 10 |
    sed 's/^bench timers_/bench timers_cassandra_async_/' | tee -a "$lines"
  # The TLS cost of the store: the blocking scenario again with TLS to the
  # same node (scripts/services/cassandra takes TLS on 9042 too; its CA is
  # made at its start), against the plaintext row above.
  cass_ca="${PROSODY_SERVICES_RUN:-/tmp/prosody-services}/cassandra/tls/ca.pem"
  if [ -f "$cass_ca" ]; then
    echo "== timers on the Cassandra store over TLS (same scenario as the blocking one) =="
    PROSODY_CASSANDRA_SSL=true PROSODY_CASSANDRA_SSL_CA_LOCATION="$cass_ca" BENCH_CASSANDRA=localhost:9042 \
      "$build/bench/bench_timers" 100000 10000 10 | sed 's/^bench timers_/bench timers_cassandra_tls_/' | tee -a "$lines"
    p=$(awk '$2 == "timers_cassandra_scheduled" {print $3}' "$lines")
    t=$(awk '$2 == "timers_cassandra_tls_scheduled" {print $3}' "$lines")
    echo "bench timers_cassandra_tls_vs_plain $t timers/s ratio=$(awk -v t="$t" -v p="$p" 'BEGIN {printf "%.3f", t / p}') plain=$p" | tee -a "$lines"
  fi
  for op in insert select; do
    o=$(echo "$ours" | awk -v k="${op}_ops_s" '$1 == k {print $2}')
    t=$(echo "$theirs" | awk -v k="${op}_ops_s" '$1 == k {print $2}')
    echo "bench store_${op} $o ops/s ratio=$(awk -v o="$o" -v t="$t" 'BEGIN {printf "%.2f", o / t}') python_driver=$t" | tee -a "$lines"
  done
else
  echo "== store throughput: skipped (no Cassandra on localhost:9042; scripts/services/cassandra start) =="
fi
python3 - "$lines" "$here/results/latest.json" "$here/../docs/BENCHMARKS.md" <<'PY'
import json, platform, os, re, sys, time
rows = []
for line in open(sys.argv[1]):
    p = line.split()
    if len(p) >= 4 and p[0] == "bench":
        ratio = next((float(x.split("=")[1]) for x in p[4:] if x.startswith("ratio=")), None)
        value = None if p[2] == "n/a" else float(p[2])
        rows.append({"name": p[1], "value": value, "unit": p[3], "ratio": ratio,
                     "note": " ".join(x for x in p[4:] if not x.startswith("ratio="))})
doc = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
       "machine": {"cpus": os.cpu_count(), "kernel": platform.release()},
       "results": rows}
json.dump(doc, open(sys.argv[2], "w"), indent=2)
print("wrote", sys.argv[2])
# The results table in docs/BENCHMARKS.md, between its markers.
table = ["| benchmark | value | unit | ratio | notes |", "|---|---|---|---|---|"]
for r in rows:
    v = "n/a" if r["value"] is None else "%g" % r["value"]
    ratio = "" if r["ratio"] is None else "%.3g" % r["ratio"]
    table.append("| %s | %s | %s | %s | %s |" % (r["name"], v, r["unit"], ratio, r["note"]))
table.append("")
table.append("Measured %s on %d CPUs (kernel %s)." % (doc["when"], doc["machine"]["cpus"], doc["machine"]["kernel"]))
md = open(sys.argv[3]).read()
md = re.sub(r"(<!-- results -->\n).*?(<!-- /results -->)", lambda m: m.group(1) + "\n".join(table) + "\n" + m.group(2), md, flags=re.S)
open(sys.argv[3], "w").write(md)
print("updated", sys.argv[3])
PY
