#!/usr/bin/env bash
# `make test-dist`: every artefact in dist/ (make dist, dist-python,
# dist-node) installed in fresh directories outside the checkout and run, in
# an environment as bare as this machine makes it (no LD_LIBRARY_PATH,
# PYTHONPATH, NODE_PATH, PKG_CONFIG_PATH nor PROSODY_* variables):
#
#  - C: the release tarball unpacked, built and installed with CMake into a
#    prefix; the README's example built against it with pkg-config (shared
#    library) and with find_package (static library), both run on the
#    embedded mock; the installed CLI reports the version.
#  - Python: each wheel installed (offline) into a fresh venv of its
#    interpreter: the version, the extension's libraries (ldd: every one
#    resolved, none from the checkout, all but the system's from the wheel),
#    the quick start of bindings/python/README.md on the mock. Then the
#    source distribution installed into a fresh venv (a full build), and the
#    same quick start. An interpreter older than 3.8 and a wheel for another
#    CPython are refused at install time.
#  - Node: the npm tarball installed into an empty project with no compiler
#    or CMake on the PATH (only node and npm): it takes the prebuilt addon;
#    its libraries as for the wheel; the quick start of
#    bindings/node/README.md. On another CPU (process.arch faked) and without a
#    compiler the install fails, naming what is supported; with
#    PROSODY_BUILD_FROM_SOURCE=1 and a compiler it builds the addon from the
#    sources the package carries, and the quick start runs on that.
#
# Prints each check and ends with "test-dist: N passed, N failed".
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dist="$root/dist"
v=$("$root/scripts/dist.sh" version) || exit 1
tmp=$(mktemp -d /tmp/prosody-test-dist.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
unset LD_LIBRARY_PATH LD_PRELOAD PYTHONPATH PYTHONHOME NODE_PATH NODE_OPTIONS PKG_CONFIG_PATH \
  VIRTUAL_ENV CC CFLAGS LDFLAGS
for var in $(compgen -e | grep '^PROSODY_'); do unset "$var"; done
cd "$tmp" || exit 1
passed=0
failed=0
t0=$(date +%s)

ok() { passed=$((passed + 1)); echo "ok: $*"; }
bad() { failed=$((failed + 1)); echo "FAILED: $*"; }
# check NAME CMD...: runs CMD (its output in $tmp/NAME.log), reports it.
check() {
  local name=$1 s=$SECONDS
  shift
  if "$@" >"$tmp/$name.log" 2>&1; then
    ok "$name ($((SECONDS - s)) s)"
  else
    bad "$name ($((SECONDS - s)) s); its output:"
    tail -40 "$tmp/$name.log"
  fi
}
# The first ```LANG block after the line matching MARK in FILE.
snippet() {
  awk -v mark="$2" -v lang="$3" '
    index($0, mark) {m = 1}
    m && !c && $0 == "```" lang {c = 1; next}
    c && $0 == "```" {exit}
    c {print}' "$1"
}
# No library of FILE unresolved or from the checkout; every one but glibc's
# and the manylinux policy's (libz) from DIR.
libs_ok() {
  local file=$1 dir=$2 out
  out=$(ldd "$file") || return 1
  echo "$out"
  ! grep -q 'not found' <<<"$out" || { echo "unresolved library"; return 1; }
  ! grep -qF "$root" <<<"$out" || { echo "resolved from the checkout $root"; return 1; }
  awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' <<<"$out" | while read -r name path; do
    case "$name" in
    libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | libresolv.so.* | \
      libgcc_s.so.* | libstdc++.so.* | libz.so.* | ld-linux*) ;;
    *) [ "$(dirname "$(readlink -f "$path")")" = "$(readlink -f "$dir")" ] ||
      { echo "$name comes from $path, not from $dir"; exit 1; } ;;
    esac
  done
}
need() { [ -f "$1" ] || { bad "missing $1 (make dist dist-python dist-node)"; return 1; }; }

# ---------------------------------------------------------------------------
# C

c_release() {
  tar -xzf "$dist/prosody-$v.tar.gz" -C "$tmp/c" &&
    cd "$tmp/c/prosody-$v" &&
    cmake -S . -B b -DCMAKE_INSTALL_PREFIX="$tmp/c/prefix" &&
    cmake --build b -j "${JOBS:-2}" && cmake --install b
}
c_shared() {
  local pc="$tmp/c/prefix/lib/pkgconfig" lib
  cd "$tmp/c/app" &&
    snippet "$tmp/c/prosody-$v/README.md" '<!-- readme-example -->' c > app.c && [ -s app.c ] &&
    # shellcheck disable=SC2046
    cc -o app app.c $(PKG_CONFIG_PATH="$pc" pkg-config --cflags --libs prosody) \
      -Wl,-rpath,"$(PKG_CONFIG_PATH="$pc" pkg-config --variable=libdir prosody)" &&
    lib=$(ldd app | awk '$1 ~ /^libprosody\.so/ {print $3}') && echo "libprosody: $lib" &&
    [ "$(dirname "$(readlink -f "$lib")")" = "$(readlink -f "$tmp/c/prefix/lib")" ] &&
    ./app | tee out.txt && grep -q 'follow-up for customer-42' out.txt
}
c_static() {
  mkdir -p "$tmp/c/cmake-app" && cd "$tmp/c/cmake-app" && cp ../app/app.c . &&
    printf '%s\n' 'cmake_minimum_required(VERSION 3.18)' 'project(app C)' \
      'find_package(prosody 0.2 REQUIRED)' 'add_executable(app app.c)' \
      'target_link_libraries(app prosody::prosody_static)' > CMakeLists.txt &&
    cmake -S . -B b -DCMAKE_PREFIX_PATH="$tmp/c/prefix" && cmake --build b &&
    ! ldd b/app | grep -q libprosody && b/app | tee out.txt &&
    grep -q 'follow-up for customer-42' out.txt
}
c_cli() {
  "$tmp/c/prefix/bin/prosody" --version | tee /dev/stderr | grep -q "^prosody $v "
}

if need "$dist/prosody-$v.tar.gz"; then
  mkdir -p "$tmp/c/app"
  check c-release-build-install c_release
  check c-readme-example-shared c_shared
  check c-readme-example-static c_static
  check c-cli-version c_cli
fi

# ---------------------------------------------------------------------------
# Python

py_quickstart() { # VENV
  cd "$(mktemp -d "$tmp/quickstart.XXXXXX")" &&
    snippet "$root/bindings/python/README.md" '## Quick start' python > quickstart.py &&
    [ -s quickstart.py ] && "$1/bin/python" quickstart.py | tee out.txt &&
    grep -q "Received message: Message(topic='my-topic'" out.txt &&
    grep -q "'content': 'Hello, Kafka!'" out.txt
}
py_version() { # VENV
  "$1/bin/python" -c "import prosody, sys; print(prosody.__version__); sys.exit(prosody.__version__ != '$v')"
}
py_wheel() { # PYTHON WHEEL
  local venv="$tmp/venv-$(basename "$2" .whl)" ext
  "$1" -m venv "$venv" && "$venv/bin/pip" install -q --disable-pip-version-check --no-index "$2" &&
    py_version "$venv" &&
    ext=$("$venv/bin/python" -c 'import prosody.prosody as m; print(m.__file__)') &&
    libs_ok "$ext" "$(dirname "$ext")/../prosody_events.libs" &&
    py_quickstart "$venv"
}
py_sdist() {
  local venv="$tmp/venv-sdist"
  python3 -m venv "$venv" &&
    "$venv/bin/pip" install -q --disable-pip-version-check "$dist/prosody_events-$v.tar.gz" &&
    py_version "$venv" && py_quickstart "$venv"
}
# An interpreter older than 3.8 is refused, naming the requirement.
# refused EXPECTED CMD...: CMD fails, saying EXPECTED.
refused() {
  local want=$1 out
  shift
  if out=$("$@" 2>&1); then
    echo "$out"; echo "succeeded: $*"; return 1
  fi
  echo "$out"
  grep -qF "$want" <<<"$out" || { echo "the error does not say: $want"; return 1; }
}
py_old() { # PYTHON
  local venv="$tmp/venv-old"
  "$1" -m venv "$venv" &&
    refused "requires a different Python" \
      "$venv/bin/pip" install -q --disable-pip-version-check "$dist/prosody_events-$v.tar.gz"
}
py_other_tag() { # PYTHON WHEEL
  local venv="$tmp/venv-other"
  "$1" -m venv "$venv" &&
    refused "is not a supported wheel on this platform" \
      "$venv/bin/pip" install -q --disable-pip-version-check --no-index "$2"
}

if need "$dist/prosody_events-$v.tar.gz"; then
  interpreters=$("$root/scripts/dist.sh" pythons)
  for py in $interpreters; do
    tag=$("$py" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
    whl=$(ls "$dist"/prosody_events-"$v"-"$tag"-"$tag"-manylinux*.whl 2>/dev/null | head -1)
    [ -n "$whl" ] || continue
    check "python-wheel-$tag" py_wheel "$py" "$whl"
  done
  check python-sdist py_sdist
  old=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.7*/bin/python3 2>/dev/null | head -1)
  if [ -n "$old" ]; then
    check python-refuses-3.7 py_old "$old"
  else
    echo "skipped: python-refuses-3.7 (no CPython 3.7 here)"
  fi
  set -- $interpreters
  if [ $# -ge 2 ]; then
    t1=$("$1" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
    whl=$(ls "$dist"/prosody_events-"$v"-"$t1"-*.whl 2>/dev/null | head -1)
    if [ -n "$whl" ]; then
      check python-refuses-other-tag py_other_tag "$2" "$whl"
    fi
  fi
fi

# ---------------------------------------------------------------------------
# Node

mkdir -p "$tmp/bin"
ln -s "$(command -v node)" "$tmp/bin/node"
ln -s "$(command -v npm)" "$tmp/bin/npm"
ln -s /bin/sh "$tmp/bin/sh" # npm runs install scripts with sh
bare() { env PATH="$tmp/bin" "$@"; }
npm_project() { # DIR
  mkdir -p "$1" && cd "$1" && echo '{"name": "app", "version": "1.0.0", "private": true}' > package.json
}
node_install() {
  local addon
  npm_project "$tmp/node-app" &&
    ! bare sh -c 'command -v cc || command -v gcc || command -v cmake' &&
    bare npm install --no-audit --no-fund --foreground-scripts "$dist/prosody-events-prosody-$v.tgz" |
      tee install.txt && grep -q 'using the prebuilt addon' install.txt &&
    addon=$(ls node_modules/@prosody-events/prosody/prebuilds/linux-*/prosody.node) &&
    [ ! -e node_modules/@prosody-events/prosody/build ] &&
    bare node -e "const v = require('./node_modules/@prosody-events/prosody/package.json').version;
      console.log(v); process.exit(v === '$v' ? 0 : 1)" &&
    libs_ok "$addon" "$(dirname "$addon")"
}
node_quickstart() {
  cd "$tmp/node-app" &&
    snippet "$root/bindings/node/README.md" '## Quick start' javascript > quickstart.js &&
    [ -s quickstart.js ] && bare node quickstart.js | tee out.txt &&
    grep -q 'Received message: {"topic":"my-topic"' out.txt &&
    grep -q '"content":"Hello, Kafka!"' out.txt
}
# Where no prebuilt addon is taken, the package builds one from the sources
# it carries (with the compiler and CMake on the PATH).
node_from_source() {
  npm_project "$tmp/node-source" &&
    PROSODY_BUILD_FROM_SOURCE=1 npm install --no-audit --no-fund --foreground-scripts \
      "$dist/prosody-events-prosody-$v.tgz" | tee install.txt &&
    grep -q 'building the addon from source' install.txt &&
    [ -f node_modules/@prosody-events/prosody/build/Release/prosody.node ] &&
    cp "$tmp/node-app/quickstart.js" . && bare node quickstart.js | tee out.txt &&
    grep -q 'Received message: {"topic":"my-topic"' out.txt
}
node_other_arch() {
  npm_project "$tmp/node-arm64" &&
    echo "Object.defineProperty(process, 'arch', {value: 'arm64'});" > "$tmp/arm64.js" &&
    refused "Supported: the prebuilt addon for linux-x64" \
      bare NODE_OPTIONS="--require $tmp/arm64.js" npm install --no-audit --no-fund \
      --foreground-scripts "$dist/prosody-events-prosody-$v.tgz"
}

if need "$dist/prosody-events-prosody-$v.tgz"; then
  check node-install-no-compiler node_install
  check node-quickstart node_quickstart
  check node-refuses-other-arch node_other_arch
  check node-install-from-source node_from_source
fi

echo "test-dist: took $(( $(date +%s) - t0 )) s"
echo "test-dist: $passed passed, $failed failed"
[ "$failed" = 0 ]
