# shellcheck shell=bash
# Sourced by scripts that need Kafka and Cassandra (scripts/run-tests.sh,
# scripts/soak.sh): `ensure SERVICE` starts scripts/services/SERVICE unless
# it already answers, and waits until it is ready; `ensure_early SERVICE`
# only launches the start in the background (its output in
# $PROSODY_SERVICES_RUN/SERVICE-early-start.log), so that the service boots
# while other work runs: a later `ensure` waits for that start. At exit,
# only the services started here are stopped again. The caller sets WHO
# (its name, for messages) before sourcing.
ensure_started=()
declare -A ensure_early_pid=() # SERVICE -> pid of its background start
ensure_cleanup() {
  for svc in "${ensure_started[@]}"; do
    "$(dirname "${BASH_SOURCE[0]}")/$svc" stop || true
  done
}
trap ensure_cleanup EXIT

ensure_early() { # ensure_early SERVICE: begin starting it unless it answers
  local dir run
  dir="$(dirname "${BASH_SOURCE[0]}")"
  run="${PROSODY_SERVICES_RUN:-/tmp/prosody-services}"
  if ! "$dir/$1" status >/dev/null 2>&1; then
    mkdir -p "$run"
    "$dir/$1" start >"$run/$1-early-start.log" 2>&1 &
    ensure_early_pid[$1]=$!
    ensure_started+=("$1")
  fi
}

ensure() { # ensure SERVICE: start it unless it already answers
  local dir
  dir="$(dirname "${BASH_SOURCE[0]}")"
  if [ -n "${ensure_early_pid[$1]:-}" ]; then # its early start first
    wait "${ensure_early_pid[$1]}" || cat "${PROSODY_SERVICES_RUN:-/tmp/prosody-services}/$1-early-start.log" >&2
    unset "ensure_early_pid[$1]"
  fi
  if ! "$dir/$1" status >/dev/null 2>&1; then
    if "$dir/$1" start; then
      ensure_started+=("$1")
    else
      echo "$WHO: could not start $1" >&2
      exit 1
    fi
  fi
}
