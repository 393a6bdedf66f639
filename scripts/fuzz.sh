#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) and runs each for a
# bounded time. Usage: scripts/fuzz.sh [seconds per target, default 60]
# The seed corpus comes from the recorded frames in tests/data/cql/; new
# inputs libFuzzer finds stay in build-fuzz/corpus/ between runs.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
out=build-fuzz
mkdir -p "$out/corpus/cql_frame"
for hex in tests/data/cql/*.hex; do
  python3 -c 'import sys; open(sys.argv[2], "wb").write(bytes.fromhex(open(sys.argv[1]).read().strip()))' \
    "$hex" "$out/corpus/cql_frame/$(basename "$hex" .hex)"
done
clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  -Iinclude -Isrc tests/fuzz/fuzz_cql_frame.c src/cql/wire.c src/util/util.c \
  -lpthread -o "$out/fuzz_cql_frame"
echo "fuzz: cql_frame for ${secs}s"
"$out/fuzz_cql_frame" -max_total_time="$secs" -max_len=4096 -timeout=10 \
  -print_final_stats=1 "$out/corpus/cql_frame" 2>&1 | tail -n 12
