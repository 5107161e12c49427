#!/usr/bin/env bash
# ElasticMQ, an SQS-compatible server, on loopback for Courier's AWS (SQS) tests. No apt or
# npm package ships one, so the jars come from Maven Central through `mvn` into a cache
# outside git, as scripts/kafka.sh does for Kafka.
#
# Usage:
#   bash scripts/elasticmq.sh start    fetch the jars if needed, start, wait until it answers
#   bash scripts/elasticmq.sh stop     graceful stop (TERM; KILL after 30 s)
#   bash scripts/elasticmq.sh status   exit 0 when the server answers on its port
#   bash scripts/elasticmq.sh fetch    only fetch the jars
# Every command is idempotent: `start` with a server already answering does nothing.
#
# Environment:
#   COURIER_SQS_ENDPOINT    http://host:port of the server (default http://127.0.0.1:9324).
#                           Only a loopback endpoint is started here.
#   COURIER_ELASTICMQ_HOME  cache folder (default ~/.cache/courier/elasticmq): jars in
#                           lib-<version>/, each port's config, log and pid in run-<port>/
#   COURIER_ELASTICMQ_HEAP  JVM heap (default 256m)
#   COURIER_SERVICE_TIMEOUT seconds to wait for readiness (default 120)
# Needs Java 17+ and Maven (`mvn`). ElasticMQ keeps its queues in memory: a restart loses them.
set -euo pipefail

ELASTICMQ_VERSION=1.6.11
endpoint="${COURIER_SQS_ENDPOINT:-http://127.0.0.1:9324}"
hostport="${endpoint#*://}"
hostport="${hostport%%/*}"
host="${hostport%:*}"
port="${hostport##*:}"
home="${COURIER_ELASTICMQ_HOME:-$HOME/.cache/courier/elasticmq}"
lib="$home/lib-$ELASTICMQ_VERSION"
run="$home/run-$port"
heap="${COURIER_ELASTICMQ_HEAP:-256m}"
limit="${COURIER_SERVICE_TIMEOUT:-120}"

say() { printf '  elasticmq: %s\n' "$*" >&2; }
die() { printf '\033[31melasticmq: %s\033[0m\n' "$*" >&2; exit 1; }

# Answers when an SQS ListQueues call (JSON protocol) gets a JSON reply, not only when the port is open.
answers() {
  timeout 3 bash -c "exec 3<>/dev/tcp/$host/$port" 2>/dev/null || return 1
  command -v curl >/dev/null 2>&1 || return 0
  curl -s -m 3 -X POST -H 'Content-Type: application/x-amz-json-1.0' \
    -H 'X-Amz-Target: AmazonSQS.ListQueues' -d '{}' "http://$host:$port/" 2>/dev/null | grep -q '{'
}

pid_alive() { [ -f "$run/elasticmq.pid" ] && kill -0 "$(cat "$run/elasticmq.pid")" 2>/dev/null; }

fetch() {
  if [ -f "$lib/.complete" ]; then return 0; fi
  command -v java >/dev/null 2>&1 || die "java is missing: ElasticMQ needs Java 17+ (Debian: apt-get install openjdk-17-jre-headless)"
  command -v mvn >/dev/null 2>&1 || die "mvn is missing: the jars come from Maven Central (Debian: apt-get install maven)"
  local began=$SECONDS work
  work="$(mktemp -d)"
  cat >"$work/pom.xml" <<EOF
<project>
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.courier</groupId>
  <artifactId>courier-elasticmq-test-server</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.elasticmq</groupId><artifactId>elasticmq-server_2.13</artifactId><version>$ELASTICMQ_VERSION</version></dependency>
  </dependencies>
  <build><plugins><plugin>
    <groupId>org.apache.maven.plugins</groupId><artifactId>maven-dependency-plugin</artifactId><version>3.8.1</version>
  </plugin></plugins></build>
</project>
EOF
  say "fetching ElasticMQ $ELASTICMQ_VERSION jars from Maven Central into $lib"
  rm -rf "$lib.tmp"
  (cd "$work" && mvn -B -q dependency:copy-dependencies -DoutputDirectory="$lib.tmp" -DincludeScope=runtime </dev/null >&2) ||
    die "mvn could not fetch the ElasticMQ jars (is Maven Central reachable? see the output above)"
  rm -rf "$lib" "$work"
  mv "$lib.tmp" "$lib"
  touch "$lib/.complete"
  say "jars fetched in $((SECONDS - began))s ($(ls "$lib" | wc -l) files)"
}

configure() {
  mkdir -p "$run"
  # Loopback only; strict limits so the tests meet SQS's real limits (10 per batch,
  # 256 KiB messages, 10 message attributes are checked by the transport itself).
  cat >"$run/elasticmq.conf" <<EOF
include classpath("application.conf")
node-address { protocol = http, host = localhost, port = $port, context-path = "" }
rest-sqs { enabled = true, bind-port = $port, bind-hostname = "$host", sqs-limits = strict }
rest-stats { enabled = false }
EOF
}

start() {
  case "$host" in
    127.0.0.1 | localhost) ;;
    *) answers && { say "SQS answers on $endpoint"; return 0; }
      die "$endpoint does not answer, and only a loopback server is started here: start yours or set COURIER_SQS_ENDPOINT" ;;
  esac
  if answers; then say "SQS answers on $endpoint"; return 0; fi
  if timeout 3 bash -c "exec 3<>/dev/tcp/$host/$port" 2>/dev/null; then
    die "port $port is open but does not answer SQS calls; set COURIER_SQS_ENDPOINT=http://127.0.0.1:<free port>"
  fi
  fetch
  configure
  local began=$SECONDS
  : >"$run/elasticmq.log"
  # setsid: the server outlives the shell that started it (CI steps, test runners).
  setsid nohup java "-Xms64m" "-Xmx$heap" "-Dconfig.file=$run/elasticmq.conf" -cp "$lib/*" org.elasticmq.server.Main \
    >"$run/elasticmq.log" 2>&1 </dev/null &
  echo $! >"$run/elasticmq.pid"
  until answers; do
    if ! pid_alive; then
      tail -40 "$run/elasticmq.log" >&2
      rm -f "$run/elasticmq.pid"
      die "ElasticMQ died while starting (log above, full log $run/elasticmq.log)"
    fi
    [ $((SECONDS - began)) -lt "$limit" ] || die "ElasticMQ was not ready within ${limit}s; see $run/elasticmq.log"
    sleep 0.2
  done
  say "ready on $endpoint after $((SECONDS - began))s (pid $(cat "$run/elasticmq.pid"), log $run/elasticmq.log)"
}

stop() {
  pid_alive || { rm -f "$run/elasticmq.pid"; say "no server of ours runs on $port"; return 0; }
  local pid
  pid="$(cat "$run/elasticmq.pid")"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 300); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$run/elasticmq.pid"; say "stopped"; return 0; }
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$run/elasticmq.pid"
  say "did not stop within 30 s: killed"
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  status) answers ;;
  fetch) fetch ;;
  *) die "unknown command '$1' (start | stop | status | fetch)" ;;
esac
