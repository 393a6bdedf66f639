#!/usr/bin/env bash
# Provides a librdkafka of at least PROSODY_RDKAFKA_MIN (2.10.0) for the
# build and prints its install prefix as the last line of stdout.
#
#   scripts/librdkafka.sh            the prefix (building it when needed)
#   scripts/librdkafka.sh --check    exit 0 when a cached build is present
#   PROSODY_RDKAFKA_FLAVOUR=c11 scripts/librdkafka.sh
#                                    the same, built on glibc's C11 threads
#                                    as Debian builds it (for ThreadSanitizer
#                                    builds: they link it as a shared library
#                                    whose own lock calls tests/tsan.supp
#                                    ignores, with src/util/tsan_shim.c
#                                    giving TSan its C11 locks)
#
# Where it comes from, in order:
#  1. the cache, ${PROSODY_DEPS_CACHE:-${XDG_CACHE_HOME:-~/.cache}/prosody-deps},
#     when it holds a build that meets the floor (no network needed);
#  2. Debian's own source package: the newest version that Debian's
#     development suites (unstable, testing) carry, chosen by comparing
#     versions against the floor, never by a file name (Debian replaces
#     point releases and the old files vanish). It is fetched with
#     `apt-get source` through a private sources list, lists and cache
#     under the build directory, so the machine's apt setup is left alone.
#
# The build: upstream's configure (mklove) with Debian's orig tarball,
# without Debian's three patches (they only switch the bundled cJSON and
# nanopb to Debian's packages, which bookworm does not carry), with pthreads
# rather than glibc's C11 threads (ThreadSanitizer sees pthreads), and with
# ssl, sasl, zstd, lz4, zlib and curl as dynamic system libraries. The
# result (static PIC archive, headers, .pc files) lands in the cache under
# librdkafka-VERSION/ and is reused by every later build.
#
# A system librdkafka is CMake's business: CMakeLists.txt calls this script
# only when pkg-config finds none that meets the floor.
set -euo pipefail

min="${PROSODY_RDKAFKA_MIN:-2.10.0}"
cache="${PROSODY_DEPS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/prosody-deps}"
suites="${PROSODY_RDKAFKA_SUITES:-sid testing}"
mirror="${PROSODY_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
flavour="${PROSODY_RDKAFKA_FLAVOUR:-}"
case "$flavour" in
"") sfx=""; threads=--disable-c11threads ;;
c11) sfx="-c11"; threads=--enable-c11threads ;;
*) echo "librdkafka: unknown PROSODY_RDKAFKA_FLAVOUR $flavour (expected c11 or nothing)" >&2; exit 2 ;;
esac

log() { echo "librdkafka: $*" >&2; }
meets() { dpkg --compare-versions "$1" ge "$min"; }

# 1. A cached build, newest first.
cached() {
  local d v best=""
  for d in "$cache"/librdkafka-*"$sfx"/; do
    [ -f "$d/.complete" ] || continue
    v=$(basename "$d"); v=${v#librdkafka-}; v=${v%"$sfx"}
    case "$v" in *-*) continue ;; esac # another flavour
    meets "$v" || continue
    if [ -z "$best" ] || dpkg --compare-versions "$v" gt "$best"; then best=$v; fi
  done
  [ -n "$best" ] && echo "$cache/librdkafka-$best$sfx"
}

if prefix=$(cached); then
  [ "${1:-}" = --check ] && exit 0
  log "using the cached build $prefix"
  echo "$prefix"
  exit 0
fi
[ "${1:-}" = --check ] && exit 1

for tool in apt-get dpkg-source make cc pkg-config; do
  command -v "$tool" >/dev/null || {
    log "needs $tool (scripts/deps.sh installs it)"; exit 1; }
done

mkdir -p "$cache"
# One build at a time (the CMake trees of the library and of both packages
# may configure at once on a fresh machine); the winner's result is reused.
exec 9>"$cache/.lock"
flock 9
if prefix=$(cached); then
  log "using the cached build $prefix"
  echo "$prefix"
  exit 0
fi
work=$(mktemp -d "$cache/.work.XXXXXX")
trap 'rm -rf "$work"' EXIT
apt_dir="$work/apt"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/src"
: > "$apt_dir/sources.list"
for s in $suites; do
  echo "deb-src $mirror $s main" >> "$apt_dir/sources.list"
done
apt_opts=(-o "Dir::Etc::sourcelist=$apt_dir/sources.list"
  -o "Dir::Etc::sourceparts=-" -o "Dir::State::lists=$apt_dir/lists"
  -o "Dir::Cache=$apt_dir/cache" -o "APT::Sandbox::User=root")
log "reading Debian's source index ($suites)"
apt-get "${apt_opts[@]}" -qq update

# 2. The newest source version that meets the floor.
versions=$(apt-cache "${apt_opts[@]}" showsrc librdkafka 2>/dev/null |
  awk '/^Package: librdkafka$/ {p=1; next} /^Package:/ {p=0} p && /^Version:/ {print $2}')
best=""
for v in $versions; do
  up=${v%-*}; up=${up#*:}
  meets "$up" || continue
  if [ -z "$best" ] || dpkg --compare-versions "$v" gt "$best"; then best=$v; fi
done
if [ -z "$best" ]; then
  log "Debian's suites ($suites) carry no librdkafka >= $min (seen: ${versions:-none})"
  exit 1
fi
upstream=${best%-*}; upstream=${upstream#*:}
log "building librdkafka $upstream (Debian source $best) into $cache"

cd "$apt_dir/src"
apt-get "${apt_opts[@]}" -qq source --download-only "librdkafka=$best" >&2
dpkg-source --skip-patches -x ./*.dsc src >/dev/null
cd src
got=$(sed -n 's/^#define RD_KAFKA_VERSION *0x\([0-9a-f]*\).*/\1/p' src/rdkafka.h)
got_str=$(printf '%d.%d.%d' "0x${got:0:2}" "0x${got:2:2}" "0x${got:4:2}")
if [ "$got_str" != "$upstream" ] || ! meets "$got_str"; then
  log "the source says version $got_str, expected $upstream (floor $min)"
  exit 1
fi

prefix="$cache/librdkafka-$upstream$sfx"
rm -rf "$prefix"
./configure --prefix="$prefix" --libdir="$prefix/lib" $threads \
  --enable-ssl --enable-sasl --enable-zstd --enable-lz4-ext --enable-curl \
  --enable-zlib >"$work/configure.log" 2>&1 ||
  { tail -30 "$work/configure.log" >&2; exit 1; }
make -j"${JOBS:-2}" -C src lib >"$work/make.log" 2>&1 ||
  { tail -30 "$work/make.log" >&2; exit 1; }
make -C src install >"$work/install.log" 2>&1 ||
  { tail -30 "$work/install.log" >&2; exit 1; }
echo "$best" > "$prefix/.debian-version"
touch "$prefix/.complete"
log "built $prefix"
echo "$prefix"
