# shellcheck shell=bash disable=SC2012
# Shared helpers for the scripts in scripts/services (kafka, kafka4,
# kafka-cluster, cassandra, jaeger). Sourced, not executed. The caller sets
# SERVICE (its run directory's name and its JVM's marker) before sourcing and
# defines probe() (exit 0 when the service really answers).
#
# Environment (all optional):
#   PROSODY_SERVICES_CACHE  jar cache, kept across runs  (default ~/.cache/prosody-services)
#   PROSODY_SERVICES_RUN    data, config, logs, pid file (default /tmp/prosody-services)

# shellcheck disable=SC2034  # used by the sourcing scripts
SERVICES_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_ROOT="${PROSODY_SERVICES_CACHE:-${HOME:-/root}/.cache/prosody-services}"
RUN_ROOT="${PROSODY_SERVICES_RUN:-/tmp/prosody-services}"
RUN_DIR="$RUN_ROOT/$SERVICE"
PID_FILE="$RUN_DIR/$SERVICE.pid"
# Every JVM we launch carries this property, so stop/status can recognise our
# own process (and never signal a recycled pid or someone else's server).
MARKER="-Dprosody.service=$SERVICE"

say() { printf '%s: %s\n' "$SERVICE" "$*"; }
die() { printf '%s: error: %s\n' "$SERVICE" "$*" >&2; exit 1; }

now() { date +%s.%N; }
# elapsed START -> seconds with one decimal since START
elapsed() { awk -v s="$1" -v e="$(now)" 'BEGIN { printf "%.1f", e - s }'; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo -n "$@"
  else die "need root (or sudo) to run: $*"
  fi
}

apt_install() {
  say "installing Debian packages: $*"
  export DEBIAN_FRONTEND=noninteractive
  # .ci/run updates the package lists once and says so.
  [ "${PROSODY_APT_UPDATED:-0}" = 1 ] || as_root apt-get update -qq
  as_root apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

java_major() {
  "$1" -XshowSettings:properties -version 2>&1 |
    awk -F'= ' '/java.specification.version/ { v = $2; sub(/^1\./, "", v); print v; exit }'
}

# ensure_tools any|ALLOWED_JAVA_MAJORS... : makes mvn, python3 and a suitable
# java available, installing Debian packages if needed; sets JAVA.
ensure_tools() {
  local want=("$@") pkgs=() candidate major
  command -v python3 >/dev/null 2>&1 || pkgs+=(python3)
  command -v mvn >/dev/null 2>&1 || pkgs+=(maven)
  if ! command -v java >/dev/null 2>&1 && [ -z "${JAVA_HOME:-}" ]; then
    pkgs+=(openjdk-17-jre-headless)
  fi
  if [ "${#pkgs[@]}" -gt 0 ]; then apt_install "${pkgs[@]}"; fi

  JAVA=""
  for candidate in ${JAVA_HOME:+"$JAVA_HOME/bin/java"} "$(command -v java || true)" \
      /usr/lib/jvm/java-17-openjdk-*/bin/java /usr/lib/jvm/java-11-openjdk-*/bin/java; do
    if [ -z "$candidate" ] || [ ! -x "$candidate" ]; then continue; fi
    major="$(java_major "$candidate")"
    if [[ " ${want[*]} " == *" any "* || " ${want[*]} " == *" $major "* ]]; then
      JAVA="$candidate"
      break
    fi
  done
  if [ -z "$JAVA" ]; then
    apt_install openjdk-17-jre-headless
    JAVA="$(ls /usr/lib/jvm/java-17-openjdk-*/bin/java 2>/dev/null | head -n 1)"
    [ -x "$JAVA" ] || die "no usable java (need major version ${want[*]})"
  fi
}

# resolve_jars NAME VERSION DEPENDENCY... : makes sure $CACHE_ROOT/NAME-VERSION/lib
# holds the runtime closure of the given groupId:artifactId:version coordinates,
# resolved once with Maven; sets LIB_DIR. Extra Maven flags: MVN_EXTRA (array).
resolve_jars() {
  local name="$1" version="$2"; shift 2
  local dir="$CACHE_ROOT/$name-$version" started dep g a v
  LIB_DIR="$dir/lib"
  if [ -f "$dir/.complete" ]; then
    say "jars: cached ($(ls "$LIB_DIR" | wc -l) jars in $LIB_DIR)"
    return 0
  fi
  mkdir -p "$dir"
  # One resolution at a time per machine: the Maven local repository is shared.
  exec 8>"$CACHE_ROOT/.resolve.lock"
  flock 8
  if [ -f "$dir/.complete" ]; then flock -u 8; exec 8>&-; resolve_jars "$name" "$version" "$@"; return; fi

  say "jars: resolving $name $version from Maven Central into $dir"
  started="$(now)"
  {
    echo '<project xmlns="http://maven.apache.org/POM/4.0.0">'
    echo '  <modelVersion>4.0.0</modelVersion>'
    echo "  <groupId>prosody.services</groupId><artifactId>$name-jars</artifactId>"
    echo "  <version>$version</version><packaging>pom</packaging>"
    echo '  <dependencies>'
    for dep in "$@"; do
      IFS=: read -r g a v <<<"$dep"
      echo "    <dependency><groupId>$g</groupId><artifactId>$a</artifactId><version>$v</version></dependency>"
    done
    echo '  </dependencies>'
    echo '</project>'
  } >"$dir/pom.xml"
  rm -rf "$dir/lib.tmp"
  if ! mvn -B -q -f "$dir/pom.xml" -Dmaven.repo.local="$CACHE_ROOT/m2" \
      ${MVN_EXTRA[@]+"${MVN_EXTRA[@]}"} \
      org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$dir/lib.tmp" >"$dir/mvn.log" 2>&1; then
    tail -n 40 "$dir/mvn.log" >&2
    die "Maven could not resolve $name $version (full log: $dir/mvn.log)"
  fi
  rm -rf "$LIB_DIR"
  mv "$dir/lib.tmp" "$LIB_DIR"
  touch "$dir/.complete"
  flock -u 8; exec 8>&-
  say "jars: downloaded $(ls "$LIB_DIR" | wc -l) jars in $(elapsed "$started") s"
}

# our_pid: prints the pid of our running JVM (from the pid file, else by its
# marker in /proc), or nothing.
our_pid() {
  local pid="" p
  if [ -f "$PID_FILE" ]; then pid="$(cat "$PID_FILE" 2>/dev/null || true)"; fi
  if [ -n "$pid" ] && is_ours "$pid"; then echo "$pid"; return 0; fi
  for p in /proc/[0-9]*; do
    p="${p#/proc/}"
    if is_ours "$p"; then echo "$p"; return 0; fi
  done
  return 0
}

is_ours() {
  [ -r "/proc/$1/cmdline" ] || return 1
  grep -qzx -- "$MARKER" "/proc/$1/cmdline" 2>/dev/null
}

port_open() { timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

# launch LOGFILE CMD... : starts CMD detached (own session, no terminal, stdin
# from /dev/null), output appended to LOGFILE, pid written to PID_FILE.
launch() {
  local out="$1"; shift
  rm -f "$PID_FILE"
  # shellcheck disable=SC2016  # $$ and $@ belong to the inner shell
  # The inner shell writes its own pid and then execs the JVM, so the pid file
  # holds the JVM's pid whether or not setsid had to fork.
  setsid nohup bash -c 'echo $$ >"$0"; exec "$@"' "$PID_FILE" "$@" >>"$out" 2>&1 </dev/null &
  local _
  for _ in $(seq 1 50); do [ -s "$PID_FILE" ] && return 0; sleep 0.1; done
  die "could not launch $1"
}

# rotate_logs DIR : keeps one previous generation (NAME.log.prev) of every log
# in DIR, so that each start's logs (and failure tails) are its own.
rotate_logs() {
  local f
  for f in "$1"/*.log; do
    [ -f "$f" ] && mv -f "$f" "$f.prev"
  done
  return 0
}

show_logs() {
  local f
  for f in "$@"; do
    [ -s "$f" ] || continue
    echo "----- last 40 lines of $f -----" >&2
    tail -n 40 "$f" >&2
  done
}

# wait_ready TIMEOUT_S STARTED LOGS... : waits until probe succeeds; on failure
# prints the log tails, stops whatever was started and exits 1.
wait_ready() {
  local limit="$1" started="$2"; shift 2
  local deadline=$(( $(date +%s) + limit )) pid
  while :; do
    if probe; then return 0; fi
    pid="$(our_pid)"
    if [ -z "$pid" ]; then
      show_logs "$@"
      die "the $SERVICE process exited during start-up after $(elapsed "$started") s (logs: $RUN_DIR/logs)"
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
      show_logs "$@"
      say "not answering after ${limit} s; stopping it" >&2
      stop_service 20 >&2 || true
      die "$SERVICE did not become ready within ${limit} s (logs: $RUN_DIR/logs)"
    fi
    sleep 1
  done
}

# stop_service GRACE_S PORTS... : SIGTERM, wait up to GRACE_S, then SIGKILL;
# then confirms the ports are closed.
stop_service() {
  local grace="$1"; shift
  local pid started deadline port
  pid="$(our_pid)"
  started="$(now)"
  if [ -n "$pid" ]; then
    say "stopping pid $pid (SIGTERM)"
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$(( $(date +%s) + grace ))
    while is_ours "$pid" && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.2; done
    if is_ours "$pid"; then
      say "still running after ${grace} s; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      while is_ours "$pid"; do sleep 0.1; done
    fi
  fi
  rm -f "$PID_FILE"
  for port in "$@"; do
    deadline=$(( $(date +%s) + 10 ))
    while port_open "$port"; do
      if [ "$(date +%s)" -ge "$deadline" ]; then
        die "port $port is still open, but not by a process this script started"
      fi
      sleep 0.2
    done
  done
  if [ -n "$pid" ]; then say "stopped in $(elapsed "$started") s"; else say "not running"; fi
}

# ---- Kafka (scripts/services/kafka, kafka-cluster) ----
# Kafka's releases ship their own log backend, which the kafka_2.13 POM does
# not name: 3.x logs through SLF4J 1.7 to reload4j (a log4j 1 properties file,
# -Dlog4j.configuration=file:...); 4.x through log4j2 (log4j-core already
# comes with the POM; its SLF4J binding does not; a log4j2 file,
# -Dlog4j2.configurationFile=...). Without the backend the broker logs nothing.

# kafka_major VERSION : prints the major version (3 for 3.9.2).
kafka_major() { echo "${1%%.*}"; }

# kafka_jars VERSION : resolve_jars for Kafka VERSION plus the log backend of
# its release; sets LIB_DIR (<cache>/kafka-VERSION/lib).
kafka_jars() {
  local version="$1"
  if [ "$(kafka_major "$version")" -ge 4 ]; then
    # The direct slf4j-api 2.x wins over the POM's 1.7.36 (which the SLF4J 2
    # binding cannot serve); the log4j2 modules match the POM's log4j-core.
    resolve_jars kafka "$version" \
      "org.apache.kafka:kafka_2.13:$version" \
      "org.slf4j:slf4j-api:2.0.17" \
      "org.apache.logging.log4j:log4j-slf4j2-impl:2.25.4" \
      "org.apache.logging.log4j:log4j-core:2.25.4"
  else
    resolve_jars kafka "$version" \
      "org.apache.kafka:kafka_2.13:$version" \
      "ch.qos.reload4j:reload4j:1.2.25" \
      "org.slf4j:slf4j-reload4j:1.7.36"
  fi
}

# kafka_logging VERSION BASE WHO [QUIET_LOGGER...] : writes BASE.properties
# (log4j 1 for 3.x) or BASE-log4j2.properties (4.x): INFO and above to
# ${kafka.logs.dir}/server.log, the QUIET_LOGGERS (plus the request logger and
# the clients) at WARN. WHO names the generating script in the file's first
# line. Sets KAFKA_LOG_OPTS (JVM options; -Dkafka.logs.dir is the caller's).
kafka_logging() {
  local version="$1" base="$2" who="$3"; shift 3
  local quiet=(kafka.request.logger org.apache.kafka.clients "$@") logger i=0
  if [ "$(kafka_major "$version")" -ge 4 ]; then
    {
      echo "# Generated by $who: INFO to \${kafka.logs.dir}/server.log (log4j2, Kafka $version)."
      echo "status = warn"
      echo "appender.file.type = File"
      echo "appender.file.name = file"
      echo "appender.file.fileName = \${sys:kafka.logs.dir}/server.log"
      echo "appender.file.append = true"
      echo "appender.file.layout.type = PatternLayout"
      echo "appender.file.layout.pattern = [%d] %p %m (%c)%n"
      echo "rootLogger.level = INFO"
      echo "rootLogger.appenderRef.file.ref = file"
      for logger in "${quiet[@]}"; do
        i=$((i + 1))
        echo "logger.q$i.name = $logger"
        echo "logger.q$i.level = WARN"
      done
    } >"$base-log4j2.properties"
    KAFKA_LOG_OPTS=(-Dlog4j2.configurationFile="$base-log4j2.properties")
  else
    {
      echo "# Generated by $who: INFO to \$kafka.logs.dir/server.log (reload4j, Kafka $version)."
      echo "log4j.rootLogger=INFO, file"
      echo "log4j.appender.file=org.apache.log4j.FileAppender"
      echo "log4j.appender.file.File=\${kafka.logs.dir}/server.log"
      echo "log4j.appender.file.Append=true"
      echo "log4j.appender.file.layout=org.apache.log4j.PatternLayout"
      echo "log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n"
      for logger in "${quiet[@]}"; do echo "log4j.logger.$logger=WARN"; done
    } >"$base.properties"
    KAFKA_LOG_OPTS=(-Dlog4j.configuration="file:$base.properties")
  fi
}

# kafka_cluster_id : prints a fresh cluster id (a base64url UUID, 22 characters).
# Never one that starts with "-" (1 in 64 would): the storage tool's option
# parser takes it for an option, and the format fails (as Kafka's own
# Uuid.randomUuid, which draws again).
kafka_cluster_id() {
  python3 -c '
import base64, uuid
while True:
    s = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    if not s.startswith("-"):
        print(s)
        break'
}
