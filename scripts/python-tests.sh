#!/usr/bin/env bash
# The Python package's suite (bindings/python/tests), for `make test`.
#   scripts/python-tests.sh install      build the package into the venv
#   scripts/python-tests.sh mock|real    run the suite in one tier
# The venv is ${PROSODY_PY_VENV:-build/python-venv}, made with ${PYTHON:-python3}.
# The real tier expects Kafka on 127.0.0.1:9094 and Cassandra on
# 127.0.0.1:9042 (scripts/run-tests.sh starts them).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${PROSODY_PY_VENV:-$root/build/python-venv}"
what="${1:?usage: python-tests.sh install|mock|real [pytest args]}"
shift

case "$what" in
install)
  if [ ! -x "$venv/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$venv"
  fi
  # Build output stays under bindings/python/build (CMake reuses it).
  "$venv/bin/pip" install -q --disable-pip-version-check "$root/bindings/python[test]"
  echo "python-tests: installed prosody-events into $venv"
  ;;
mock | real)
  cd "$root/bindings/python/tests"
  t0=$(date +%s)
  PROSODY_TEST_TIER="$what" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
    -c ../pyproject.toml "$@"
  echo "python-tests: $what tier passed in $(( $(date +%s) - t0 )) s"
  ;;
*)
  echo "python-tests: unknown command $what" >&2
  exit 2
  ;;
esac
