#!/usr/bin/env bash
# End-to-end checks of the `prosody` CLI on the embedded mock cluster:
# version, help, config listing with sources, error messages and exit
# codes, send, topic create/delete, demo.
set -uo pipefail
cli="$1"
fails=0
out=$(mktemp); trap 'rm -f "$out"' EXIT

# Run without any PROSODY_* variables from the caller's environment.
# Sanitizer settings pass through; nothing else does.
sanenv=(); for v in ASAN_OPTIONS UBSAN_OPTIONS TSAN_OPTIONS LSAN_OPTIONS; do
  [ -n "${!v:-}" ] && sanenv+=("$v=${!v}"); done
run() { env -i PATH="$PATH" "${sanenv[@]}" "$@" >"$out" 2>&1; }
expect() { # expect CODE NEEDLE DESCRIPTION -- command...
  local code="$1" needle="$2" what="$3"; shift 4
  run "$@"; local rc=$?
  if [ "$rc" != "$code" ] || ! grep -qF -- "$needle" "$out"; then
    echo "FAIL: $what: exit $rc (want $code), output:"; sed 's/^/  | /' "$out"
    echo "  (wanted to find: $needle)"
    fails=$((fails + 1))
  else
    echo "ok: $what"
  fi
}

expect 0 "prosody 0." "--version" -- "$cli" --version
expect 0 "usage: prosody" "--help" -- "$cli" --help
expect 2 "unknown command" "unknown command" -- "$cli" frobnicate
expect 0 "max_concurrency              32" "config defaults" -- "$cli" config
expect 0 "max_concurrency              7                                  env" \
  "config shows env source" -- env PROSODY_MAX_CONCURRENCY=7 "$cli" config
expect 0 "max_concurrency              9                                  set" \
  "config shows set source (set wins over env)" -- \
  env PROSODY_MAX_CONCURRENCY=7 "$cli" --set max_concurrency=9 config
expect 2 'invalid value "lots" for option max_concurrency (environment variable PROSODY_MAX_CONCURRENCY)' \
  "invalid env value" -- env PROSODY_MAX_CONCURRENCY=lots "$cli" config
expect 2 'missing unit after "5"' "bare number duration" -- \
  "$cli" --set send_timeout=5 config
expect 2 'did you mean "max_retries"' "unknown option suggestion" -- \
  "$cli" --set max_retrys=3 config
expect 0 "note: a client could not start" "config notes missing bootstrap" -- \
  "$cli" config
expect 0 "sent to cli-topic" "send on the mock cluster" -- \
  "$cli" --set mock=true send cli-topic k1 '{"id":"1","type":"x"}'
expect 2 "is not valid JSON" "send rejects invalid JSON" -- \
  "$cli" --set mock=true send cli-topic k1 '{oops'
expect 2 "bootstrap_servers (PROSODY_BOOTSTRAP_SERVERS) is not set" \
  "send without a broker" -- "$cli" send cli-topic k1 '{}'
expect 0 "created topic cli-created" "topic create" -- \
  "$cli" --set mock=true topic create cli-created --partitions 3 --retention 7d
expect 2 "topic_partitions (PROSODY_TOPIC_PARTITIONS)" "topic create bad flag" -- \
  "$cli" --set mock=true topic create cli-x --partitions zero
expect 1 "does not exist" "topic delete unknown" -- \
  "$cli" --set mock=true topic delete cli-never-created
expect 0 "1000 of 1000 (0 failed)" "demo" -- "$cli" demo --messages 1000 --keys 50
also() { # also NEEDLE DESCRIPTION: checks the previous command's output
  if grep -qF -- "$1" "$out"; then echo "ok: $2"; else
    echo "FAIL: $2: no \"$1\" in:"; sed 's/^/  | /' "$out"; fails=$((fails + 1)); fi
}
also "50 of 50 keys stored in send order" "demo key order (stored)"
also "0 violations across 50 keys" "demo key order (consumed)"
also "consumed      1000 of 1000" "demo consumes everything"
also "prosody demo: ok" "demo verdict"
# Every follow-up timer the demo scheduled fired (and it scheduled some).
if grep -qE "timers +scheduled ([1-9][0-9]*), fired \1," "$out"; then
  echo "ok: demo timers fire"
else
  echo "FAIL: demo timers fire:"; sed 's/^/  | /' "$out"; fails=$((fails + 1))
fi

# Arguments are checked whole, naming the argument.
expect 2 'invalid --messages "1000abc"' "demo refuses a count with trailing text" -- "$cli" demo --messages 1000abc
expect 2 'invalid --messages "99999999999999999999": expected a whole number from 1 to 1000000' "demo refuses an overflowing count" -- "$cli" demo --messages 99999999999999999999
expect 2 'invalid --messages "1000001": expected a whole number from 1 to 1000000' "demo refuses a count above its bound" -- "$cli" demo --messages 1000001
expect 2 'prosody demo: --messages needs a value: a whole number from 1 to 1000000' "demo refuses a count flag without its value" -- "$cli" demo --messages
expect 2 'prosody topic create: --partitions needs a value: an integer from 1 to' "topic create refuses a flag without its value" -- \
  "$cli" --set mock=true topic create cli-x --partitions
# Secrets: never in `prosody config`, its note, or an error about them.
secret_free() { # secret_free WHAT: no known secret in the last output
  if grep -qE 'pw-S3cret|cs-S3cret|kp-S3cret|ks-S3cret' "$out"; then
    echo "FAIL: $1 prints a secret:"; sed 's/^/  | /' "$out"; fails=$((fails + 1))
  else echo "ok: $1 prints no secret"; fi
}
expect 0 "kafka_sasl_password          ****" "config masks the SASL password" -- \
  env PROSODY_BOOTSTRAP_SERVERS=h:1 PROSODY_GROUP_ID=g PROSODY_KAFKA_SECURITY_PROTOCOL=SASL_SSL \
  PROSODY_KAFKA_SASL_MECHANISM=OAUTHBEARER PROSODY_KAFKA_SASL_PASSWORD=pw-S3cret \
  PROSODY_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET=cs-S3cret PROSODY_KAFKA_SSL_KEY_PASSWORD=kp-S3cret \
  PROSODY_KAFKA_PROPERTIES=ssl.keystore.password=ks-S3cret "$cli" config
also "kafka_properties             ssl.keystore.password=****" "config masks a secret kafka property"
also "note: a client could not start" "the conflict is noted"
secret_free "config with secrets and a conflict"
expect 2 "invalid value \"****\" for option kafka_sasl_password" "a bad secret is not echoed" -- \
  "$cli" --set kafka_sasl_password=$'pw-S3cret\xff' config
secret_free "a bad secret value"
expect 2 "property enable.auto.commit is refused" "kafka_properties refuses an owned property" -- \
  "$cli" --set kafka_properties=ssl.keystore.password=ks-S3cret,enable.auto.commit=true config
secret_free "a refused kafka_properties"
expect 2 'prosody config: unexpected argument "extra"' "config --markdown refuses more arguments" -- "$cli" config --markdown extra
expect 2 'prosody: --set expects NAME=VALUE, got nothing' "--set without its value" -- "$cli" --set
expect 2 'invalid --keys "0"' "demo refuses zero keys" -- "$cli" demo --keys 0
expect 2 'prosody broker: unexpected argument "extra-arg"' "broker refuses arguments" -- "$cli" broker extra-arg
# at_once WHAT: the command run since `start=$(ms)` took under two seconds
# (the admin requests' own timeout is 30 s).
ms() { echo $(( $(date +%s%N) / 1000000 )); }
at_once() {
  local took=$(( $(ms) - start ))
  if [ "$took" -lt 2000 ]; then echo "ok: $1 within 2 s"; else
    echo "FAIL: $1 took $took ms"; fails=$((fails + 1)); fi
}
start=$(ms)
expect 1 "no Kafka broker answers at 127.0.0.1:1 (" "topic delete with nothing listening fails at once" -- \
  "$cli" --set bootstrap_servers=127.0.0.1:1 topic delete cli-nowhere
also "Connection refused" "it quotes librdkafka's reason"
at_once "topic delete on a refused port"

# broker: prints its address and serves clients until SIGTERM.
log=$(mktemp)
env -i PATH="$PATH" "${sanenv[@]}" "$cli" broker >"$log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do grep -q "listening on" "$log" && break; sleep 0.1; done
addr=$(sed -n 's/^mock Kafka cluster listening on \(.*\)$/\1/p' "$log")
if [ -n "$addr" ] && env -i PATH="$PATH" "${sanenv[@]}" "$cli" --set bootstrap_servers="$addr" \
     --set source_system=cli send via-broker k '{}' >"$out" 2>&1; then
  echo "ok: broker serves other processes at $addr"
else
  echo "FAIL: broker at '$addr'"; cat "$log" "$out"; fails=$((fails + 1))
fi
# topic create against another process's mock cluster: says at once why it
# cannot work (it waited 30 s for a controller before).
start=$(ms)
expect 1 "is a librdkafka mock cluster (id mockCluster" "topic create on prosody broker fails at once" -- \
  "$cli" --set bootstrap_servers="$addr" topic create cli-on-broker
also "creates a topic on first use, with 4 partitions" "it says what the mock does instead"
at_once "topic create on prosody broker"
start=$(ms)
expect 1 "is a librdkafka mock cluster (id mockCluster" "topic delete on prosody broker fails at once" -- \
  "$cli" --set bootstrap_servers="$addr" topic delete via-broker
at_once "topic delete on prosody broker"
# tail: prints what arrives, from the beginning, until SIGINT.
env -i PATH="$PATH" "${sanenv[@]}" timeout -s INT 10 "$cli" \
  --set bootstrap_servers="$addr" --set log=off tail via-broker >"$out" 2>&1
if grep -q '^via-broker\[[0-9]*\]@0 k {}$' "$out"; then
  echo "ok: tail prints the record"
else
  echo "FAIL: tail"; sed 's/^/  | /' "$out"; fails=$((fails + 1))
fi
kill -TERM "$pid"; wait "$pid"; rc=$?
if [ "$rc" != 0 ]; then echo "FAIL: broker exit $rc"; fails=$((fails + 1)); fi
rm -f "$log"

[ "$fails" = 0 ] || { echo "$fails CLI check(s) failed"; exit 1; }
echo "all CLI checks passed"
