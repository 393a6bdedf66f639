#!/usr/bin/env bash
# `cmake --install` into a temporary prefix (what `make install PREFIX=DIR`
# does), then build the README's example against that prefix twice, as a
# user would: with pkg-config, and with find_package(prosody) in CMake. Runs
# the pkg-config build (on the embedded mock cluster).
#   check-install.sh BUILD_DIR README_EXAMPLE.c
set -euo pipefail
build="$1"
example="$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/elsewhere/prefix" # not the configured prefix

cmake --install "$build" --prefix "$prefix" >/dev/null
pc=$(find "$prefix" -name prosody.pc)
[ -n "$pc" ] || { echo "no prosody.pc installed under $prefix" >&2; exit 1; }
export PKG_CONFIG_PATH="$(dirname "$pc")"
inc=$(pkg-config --variable=includedir prosody)
[ -f "$inc/prosody.h" ] || { echo "prosody.pc's includedir ($inc) has no prosody.h" >&2; exit 1; }

# pkg-config: the README's command line.
# shellcheck disable=SC2046
cc "$example" $(pkg-config --cflags --libs prosody) -o "$tmp/app-pc"
libdir=$(pkg-config --variable=libdir prosody)
PROSODY_MOCK=true LD_LIBRARY_PATH="$libdir" timeout 60 "$tmp/app-pc" >/dev/null
# librdkafka is private to libprosody: neither the library nor the program
# needs a librdkafka.so (the system's may be older than ours).
if LD_LIBRARY_PATH="$libdir" ldd "$tmp/app-pc" | grep -q librdkafka; then
  echo "the program loads a librdkafka.so:" >&2
  LD_LIBRARY_PATH="$libdir" ldd "$tmp/app-pc" >&2
  exit 1
fi

# libprosody.a: it carries librdkafka, and prosody.pc's Requires.private
# names the (shared) system libraries both need; the program runs without
# libprosody.so. (Not `pkg-config --static`: that would also ask for the
# static closure of libcurl and OpenSSL, which Debian's -dev packages lack.)
# shellcheck disable=SC2046
static_libs="$(pkg-config --libs $(pkg-config --print-requires-private prosody | awk '{print $1}')) -lpthread -lm -ldl -lrt"
# shellcheck disable=SC2046,SC2086
cc "$example" $(pkg-config --cflags prosody) "$libdir/libprosody.a" $static_libs \
  -o "$tmp/app-static"
if ldd "$tmp/app-static" | grep -q 'libprosody\|librdkafka'; then
  echo "the static program loads libprosody or librdkafka dynamically" >&2
  exit 1
fi
PROSODY_MOCK=true timeout 60 "$tmp/app-static" >/dev/null

# CMake: find_package(prosody) + prosody::prosody.
mkdir -p "$tmp/proj"
cp "$example" "$tmp/proj/app.c"
cat > "$tmp/proj/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.18)
project(app C)
find_package(prosody REQUIRED)
add_executable(app app.c)
target_link_libraries(app prosody::prosody)
add_executable(app_static app.c)
target_link_libraries(app_static prosody::prosody_static)
CM
cmake -S "$tmp/proj" -B "$tmp/proj/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$tmp/proj/build" >/dev/null
PROSODY_MOCK=true timeout 60 "$tmp/proj/build/app_static" >/dev/null
echo "installed to a new prefix; the README example builds with pkg-config (shared and static) and find_package (both targets), and runs without any librdkafka.so"
