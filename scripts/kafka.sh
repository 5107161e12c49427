#!/usr/bin/env bash
# A single-node Apache Kafka broker (KRaft: broker and controller in one JVM) on loopback,
# for Courier's Kafka tests, the benchmark and the example. No apt or npm package ships a
# broker, so the jars come from Maven Central through `mvn` into a cache outside git.
#
# Usage:
#   bash scripts/kafka.sh start    fetch the jars if needed, format once, start, wait until ready
#   bash scripts/kafka.sh stop     graceful stop (TERM; KILL after 30 s)
#   bash scripts/kafka.sh kill     SIGKILL the broker (restart tests); `start` brings it back
#   bash scripts/kafka.sh status   exit 0 when the broker answers on its port
#   bash scripts/kafka.sh owned    exit 0 when the broker on its port runs and was started here
#                                  (what `kill` needs; restart tests check it first)
#   bash scripts/kafka.sh fetch    only fetch the jars
# Every command is idempotent: `start` with a broker already answering does nothing.
#
# Environment:
#   COURIER_KAFKA_BROKERS  host:port of the broker (default 127.0.0.1:9092); the controller
#                          listens on port + 1. Only loopback hosts are started here.
#   COURIER_KAFKA_HOME     cache folder (default ~/.cache/courier/kafka): jars in
#                          lib-<version>/, each port's data, log and pid in run-<port>/
#   COURIER_KAFKA_HEAP     JVM heap (default 256m; the broker's RSS is then ~250-370 MB)
#   COURIER_SERVICE_TIMEOUT seconds to wait for readiness (default 120)
# Needs Java 17+ and Maven (`mvn`). Kafka 4.1.1 runs with kafkajs 2.2.4 (see
# docs/ENVIRONMENT facts in the Kafka plugin README).
set -euo pipefail

KAFKA_VERSION=4.1.1
LOG4J_VERSION=2.24.3
brokers="${COURIER_KAFKA_BROKERS:-127.0.0.1:9092}"
first="${brokers%%,*}"
host="${first%:*}"
port="${first##*:}"
home="${COURIER_KAFKA_HOME:-$HOME/.cache/courier/kafka}"
lib="$home/lib-$KAFKA_VERSION"
run="$home/run-$port"
heap="${COURIER_KAFKA_HEAP:-256m}"
limit="${COURIER_SERVICE_TIMEOUT:-120}"

say() { printf '  kafka: %s\n' "$*" >&2; }
die() { printf '\033[31mkafka: %s\033[0m\n' "$*" >&2; exit 1; }

answers() { timeout 3 bash -c "exec 3<>/dev/tcp/$host/$port" 2>/dev/null; }

pid_alive() { [ -f "$run/kafka.pid" ] && kill -0 "$(cat "$run/kafka.pid")" 2>/dev/null; }

fetch() {
  if [ -f "$lib/.complete" ]; then return 0; fi
  command -v java >/dev/null 2>&1 || die "java is missing: the broker needs Java 17+ (Debian: apt-get install openjdk-17-jre-headless)"
  command -v mvn >/dev/null 2>&1 || die "mvn is missing: the jars come from Maven Central (Debian: apt-get install maven)"
  local began=$SECONDS work
  work="$(mktemp -d)"
  # The project file lists what the broker and StorageTool need: kafka_2.13 (the broker,
  # with clients, raft, metadata, storage, coordinators, scala), kafka-tools without the
  # Connect runtime it does not use, and a log4j 2 backend bound through slf4j 1.7 (Kafka
  # 4.1 uses slf4j-api 1.7, which ignores the slf4j2 binding and would log nothing).
  cat >"$work/pom.xml" <<EOF
<project>
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.courier</groupId>
  <artifactId>courier-kafka-test-broker</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency>
      <groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>$KAFKA_VERSION</version>
      <exclusions>
        <exclusion><groupId>org.apache.kafka</groupId><artifactId>connect-runtime</artifactId></exclusion>
        <exclusion><groupId>com.fasterxml.jackson.jakarta.rs</groupId><artifactId>jackson-jakarta-rs-json-provider</artifactId></exclusion>
      </exclusions>
    </dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>$LOG4J_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>$LOG4J_VERSION</version></dependency>
  </dependencies>
  <build><plugins><plugin>
    <groupId>org.apache.maven.plugins</groupId><artifactId>maven-dependency-plugin</artifactId><version>3.8.1</version>
  </plugin></plugins></build>
</project>
EOF
  say "fetching Kafka $KAFKA_VERSION jars from Maven Central into $lib"
  rm -rf "$lib.tmp"
  (cd "$work" && mvn -B -q dependency:copy-dependencies -DoutputDirectory="$lib.tmp" -DincludeScope=runtime </dev/null >&2) ||
    die "mvn could not fetch the Kafka jars (is Maven Central reachable? see the output above)"
  rm -rf "$lib" "$work"
  mv "$lib.tmp" "$lib"
  touch "$lib/.complete"
  say "jars fetched in $((SECONDS - began))s ($(ls "$lib" | wc -l) files)"
}

configure() {
  mkdir -p "$run"
  cat >"$run/server.properties" <<EOF
# Written by scripts/kafka.sh: a single-node test broker, loopback only.
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=$host:$((port + 1))
listeners=PLAINTEXT://$host:$port,CONTROLLER://$host:$((port + 1))
advertised.listeners=PLAINTEXT://$host:$port,CONTROLLER://$host:$((port + 1))
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$run/data
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
auto.create.topics.enable=true
# One node: every internal topic has one replica.
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
# Few internal partitions: the first group join takes ~0.35 s instead of ~2.5 s.
offsets.topic.num.partitions=4
transaction.state.log.num.partitions=4
# Tests join and leave groups all the time: no initial rebalance delay, no commit linger.
group.initial.rebalance.delay.ms=0
group.coordinator.append.linger.ms=0
# Tests crash consumers on purpose: a 2 s group session (the default minimum is 6 s) moves
# a dead member's partitions sooner. The tests read this minimum and use it.
group.min.session.timeout.ms=1000
# After a SIGKILL the restarted node may register only once the old session expired.
broker.session.timeout.ms=3000
broker.heartbeat.interval.ms=1000
# The cleaner's buffer comes out of the heap (default 128 MiB).
log.cleaner.dedupe.buffer.size=16777216
EOF
  cat >"$run/log4j2.properties" <<'EOF'
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
logger.kafka.name = kafka
logger.kafka.level = WARN
logger.apache.name = org.apache.kafka
logger.apache.level = WARN
# "Kafka Server started" is the readiness line start() waits for.
logger.raftserver.name = kafka.server.KafkaRaftServer
logger.raftserver.level = INFO
logger.sc.name = state.change.logger
logger.sc.level = WARN
EOF
}

java_opts() { printf '%s' "-Xms$heap -Xmx$heap -Dlog4j2.configurationFile=$run/log4j2.properties"; }

start() {
  case "$host" in
    127.0.0.1 | localhost) ;;
    *) answers && { say "broker answers on $first"; return 0; }
      die "$first does not answer, and only a loopback broker is started here: start your broker or set COURIER_KAFKA_BROKERS" ;;
  esac
  if answers; then
    if pid_alive; then say "broker answers on $first"; return 0; fi
    # Something else on the port: not ours to use or stop.
    if ! grep -qs "Kafka Server started" "$run/kafka.log"; then
      die "port $port answers but no broker of ours runs there; set COURIER_KAFKA_BROKERS=127.0.0.1:<free port> (the controller takes port + 1)"
    fi
    say "broker answers on $first"; return 0
  fi
  fetch
  configure
  # shellcheck disable=SC2046
  if [ ! -f "$run/data/meta.properties" ]; then
    local cluster
    cluster="$(java -cp "$lib/*" "-Dlog4j2.configurationFile=$run/log4j2.properties" kafka.tools.StorageTool random-uuid)"
    java $(java_opts) -cp "$lib/*" kafka.tools.StorageTool format --standalone -t "$cluster" -c "$run/server.properties" >&2 ||
      die "formatting $run/data failed"
  fi
  local began=$SECONDS
  : >"$run/kafka.log"
  # setsid: the broker outlives the shell that started it (CI steps, test runners).
  # shellcheck disable=SC2046
  setsid nohup java $(java_opts) -cp "$lib/*" kafka.Kafka "$run/server.properties" >"$run/kafka.log" 2>&1 </dev/null &
  echo $! >"$run/kafka.pid"
  while ! grep -q "Kafka Server started" "$run/kafka.log"; do
    if ! pid_alive; then
      tail -40 "$run/kafka.log" >&2
      rm -f "$run/kafka.pid"
      die "the broker died while starting (log above, full log $run/kafka.log)"
    fi
    [ $((SECONDS - began)) -lt "$limit" ] || die "the broker was not ready within ${limit}s; see $run/kafka.log"
    sleep 0.2
  done
  say "broker ready on $first after $((SECONDS - began))s (pid $(cat "$run/kafka.pid"), log $run/kafka.log)"
}

stop() {
  pid_alive || { rm -f "$run/kafka.pid"; say "no broker of ours runs on $port"; return 0; }
  local pid
  pid="$(cat "$run/kafka.pid")"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 300); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$run/kafka.pid"; say "stopped"; return 0; }
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$run/kafka.pid"
  say "did not stop within 30 s: killed"
}

crash() {
  pid_alive || die "no broker of ours runs on $port"
  local pid
  pid="$(cat "$run/kafka.pid")"
  kill -KILL "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  rm -f "$run/kafka.pid"
  say "broker SIGKILLed (pid $pid)"
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  kill) crash ;;
  status) answers ;;
  owned) pid_alive && answers || die "no broker started by this script runs on $first (no live pid in $run/kafka.pid): kill/start need one (bash scripts/kafka.sh start with COURIER_KAFKA_BROKERS=127.0.0.1:<free port>)" ;;
  fetch) fetch ;;
  *) die "unknown command '$1' (start | stop | kill | status | owned | fetch)" ;;
esac
