#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) and runs each for a
# bounded time. Usage: scripts/fuzz.sh [seconds per target, default 60]
#   cql_frame   the CQL frame decoder (seeds: recorded frames, tests/data/cql/)
#   json_valid  the payload validator, and its "id" capture for dedup, against
#               jansson (seeds: tests/data/json/)
#   options     every option's value parser and the duration parser: accepted
#               values print as text that parses back the same
#   record      a record's key, headers and payload bytes through the engine's
#               intake path to what a handler reads (src/engine/record.c;
#               seeds: tests/data/record/, format in tests/fuzz/fuzz_record.c)
# New inputs libFuzzer finds stay in build-fuzz/corpus/ between runs.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
out=build-fuzz
cc=(clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
    -Iinclude -Isrc)

mkdir -p "$out/corpus/cql_frame" "$out/corpus/json_valid" "$out/corpus/options" \
  "$out/corpus/record"
for hex in tests/data/cql/*.hex; do
  python3 -c 'import sys; open(sys.argv[2], "wb").write(bytes.fromhex(open(sys.argv[1]).read().strip()))' \
    "$hex" "$out/corpus/cql_frame/$(basename "$hex" .hex)"
done
cp tests/data/json/* "$out/corpus/json_valid/"
cp tests/data/record/* "$out/corpus/record/"

"${cc[@]}" tests/fuzz/fuzz_cql_frame.c src/cql/wire.c src/util/util.c \
  -lpthread -o "$out/fuzz_cql_frame"
"${cc[@]}" tests/fuzz/fuzz_json_valid.c src/util/jsonv.c src/util/util.c \
  $(pkg-config --cflags --libs jansson) -lpthread -o "$out/fuzz_json_valid"

"${cc[@]}" tests/fuzz/fuzz_options.c src/config/config.c src/config/duration.c \
  src/util/util.c src/error.c -lpthread -lm -o "$out/fuzz_options"

# The librdkafka the library links (CMake passes its prefix; else the one
# scripts/librdkafka.sh provides), never an older system one.
rdk="${PROSODY_RDKAFKA_PREFIX:-$(scripts/librdkafka.sh | tail -n 1)}"
rdk_pc=rdkafka
[ -f "$rdk/lib/pkgconfig/rdkafka-static.pc" ] && rdk_pc=rdkafka-static
"${cc[@]}" -D_GNU_SOURCE tests/fuzz/fuzz_record.c src/engine/record.c \
  src/util/jsonv.c src/util/util.c \
  $(PKG_CONFIG_PATH="$rdk/lib/pkgconfig:$rdk/lib/$(gcc -print-multiarch)/pkgconfig" \
    pkg-config --cflags --libs $rdk_pc) \
  $(pkg-config --cflags --libs jansson libuv) -lpthread \
  -o "$out/fuzz_record"

for target in cql_frame json_valid options record; do
  echo "fuzz: $target for ${secs}s"
  "$out/fuzz_$target" -max_total_time="$secs" -max_len=4096 -timeout=10 \
    -artifact_prefix="$out/" \
    -print_final_stats=1 "$out/corpus/$target" 2>&1 | tail -n 12
done
