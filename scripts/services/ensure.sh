# shellcheck shell=bash
# Sourced by scripts that need Kafka and Cassandra (scripts/run-tests.sh,
# scripts/soak.sh): `ensure SERVICE` starts scripts/services/SERVICE unless
# it already answers; at exit, only the services started here are stopped
# again. The caller sets WHO (its name, for messages) before sourcing.
ensure_started=()
ensure_cleanup() {
  for svc in "${ensure_started[@]}"; do
    "$(dirname "${BASH_SOURCE[0]}")/$svc" stop || true
  done
}
trap ensure_cleanup EXIT

ensure() { # ensure SERVICE: start it unless it already answers
  local dir
  dir="$(dirname "${BASH_SOURCE[0]}")"
  if ! "$dir/$1" status >/dev/null 2>&1; then
    if "$dir/$1" start; then
      ensure_started+=("$1")
    else
      echo "$WHO: could not start $1" >&2
      exit 1
    fi
  fi
}
