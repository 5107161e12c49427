#!/usr/bin/env bash
# Prepares the local services Courier's tests and examples use, idempotently:
#   PostgreSQL  role courier/courier (LOGIN CREATEDB REPLICATION), database courier_test owned by it;
#               role courier_noperm/courier_noperm (LOGIN, no privilege: the CLI's
#               permission-denied test)
#   MariaDB     user courier/courier at 127.0.0.1 and localhost, database courier_test,
#               all privileges on courier_test and on every courier_* database
#   RabbitMQ    guest/guest on loopback (its default)
#   NATS        with JetStream on 127.0.0.1:4222 (nats-server -js); if a server there
#               answers without JetStream, a second one is started on 4223 and used
#   Kafka       a single-node KRaft broker on 127.0.0.1:9092 (scripts/kafka.sh: jars from
#               Maven Central into ~/.cache/courier/kafka, then started in the background)
#   SQS         ElasticMQ on 127.0.0.1:9324 (scripts/elasticmq.sh: jars from Maven Central
#               into ~/.cache/courier/elasticmq, then started in the background)
#   Redis       7.x on 127.0.0.1:6379 (Debian's redis-server; started keeping nothing on
#               disk, as on the project's machines)
#   Chromium    Debian's chromium package at /usr/bin/chromium (installed with apt-get when
#               missing), for the operator console's browser tests (playwright-core)
# Each service that does not answer is started (Debian packages' commands, as on the
# project's machines), then waited for with a bounded loop; one that never answers fails
# the script with what failed and how to start it by hand.
#
# Usage:
#   source scripts/services.sh          prepare, and export the COURIER_*_URL variables
#   eval "$(bash scripts/services.sh)"  the same from any shell (prints export lines)
#
# Environment:
#   COURIER_PG_URL, COURIER_MARIADB_URL, COURIER_RABBITMQ_URL, COURIER_NATS_URL,
#   COURIER_KAFKA_BROKERS, COURIER_SQS_ENDPOINT, COURIER_REDIS_URL     kept if already set
#   COURIER_SERVICES=skip     touch no service, only export the URLs (your own servers)
#   COURIER_TESTCONTAINERS=1  the same: the tests start containers themselves
#   COURIER_SERVICE_TIMEOUT   seconds to wait for each service (default 120)
#
# Starting services needs root (or password-less sudo); it is what CI does.

_cs_log() { printf '  services: %s\n' "$*" >&2; }
_cs_fail() { printf '\033[31mservices: %s\033[0m\n' "$*" >&2; return 1; }

# Runs a command as root: directly when we are root, else through password-less sudo.
_cs_root() {
  if [ "$(id -u)" = "0" ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo -n -- "$@"
  else
    _cs_fail "need root (or password-less sudo) to run: $*"
  fi
}

# Runs a command as another system user (postgres), from / so it can read its cwd.
_cs_as() {
  local user="$1"
  shift
  if [ "$(id -un)" = "$user" ]; then
    (cd / && "$@")
  elif [ "$(id -u)" = "0" ]; then
    (cd / && runuser -u "$user" -- "$@")
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    (cd / && sudo -n -u "$user" -- "$@")
  else
    _cs_fail "need root (or password-less sudo) to run as $user: $*"
  fi
}

# _cs_wait NAME CHECK_FUNCTION: polls the check once a second, at most COURIER_SERVICE_TIMEOUT s.
_cs_wait() {
  local name="$1" check="$2" limit="${COURIER_SERVICE_TIMEOUT:-120}" waited=0
  until "$check"; do
    if [ "$waited" -ge "$limit" ]; then
      return 1
    fi
    sleep 1
    waited=$((waited + 1))
  done
  _cs_log "$name answers (waited ${waited}s)"
}

_cs_tcp_open() {
  timeout 3 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null
}

# ---------------------------------------------------------------- PostgreSQL
_cs_pg_up() { pg_isready -q -h 127.0.0.1 -p 5432 -t 3 </dev/null; }

_cs_pg_start() {
  local version
  version="$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)"
  [ -n "$version" ] && command -v pg_ctlcluster >/dev/null 2>&1 ||
    { _cs_fail "PostgreSQL is not installed here (no /etc/postgresql, no pg_ctlcluster); install PostgreSQL 15+ or set COURIER_PG_URL and COURIER_SERVICES=skip"; return 1; }
  _cs_log "starting PostgreSQL $version: pg_ctlcluster --skip-systemctl-redirect $version main start"
  _cs_root pg_ctlcluster --skip-systemctl-redirect "$version" main start </dev/null >&2 ||
    _cs_log "pg_ctlcluster start exited non-zero; waiting anyway"
}

# The log-tailing relay reads the outbox through logical replication, which needs
# wal_level = logical; it takes a restart, so it is done once here (never by a test: the
# server is shared by every checkout on the machine) and only when the level is lower.
_cs_pg_logical() {
  local level version
  level="$(_cs_as postgres psql -X -qtA -d postgres -c 'SHOW wal_level' </dev/null 2>/dev/null)"
  [ "$level" = logical ] && return 0
  version="$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)"
  _cs_log "PostgreSQL: wal_level is '${level:-unknown}'; setting it to logical and restarting (pg_ctlcluster $version main restart)"
  _cs_as postgres psql -X -q -v ON_ERROR_STOP=1 -d postgres -c 'ALTER SYSTEM SET wal_level = logical' </dev/null >&2 ||
    { _cs_fail "could not set wal_level = logical (ALTER SYSTEM as the postgres user)"; return 1; }
  _cs_root pg_ctlcluster --skip-systemctl-redirect "$version" main restart </dev/null >&2 ||
    _cs_log "pg_ctlcluster restart exited non-zero; waiting anyway"
  _cs_wait PostgreSQL _cs_pg_up ||
    { _cs_fail "PostgreSQL did not come back within ${COURIER_SERVICE_TIMEOUT:-120}s after the wal_level restart; see /var/log/postgresql/"; return 1; }
  level="$(_cs_as postgres psql -X -qtA -d postgres -c 'SHOW wal_level' </dev/null 2>/dev/null)"
  [ "$level" = logical ] ||
    { _cs_fail "PostgreSQL still reports wal_level '$level' after the restart; set wal_level = logical in postgresql.conf"; return 1; }
}

_cs_pg_prepare() {
  command -v pg_isready >/dev/null 2>&1 ||
    { _cs_fail "PostgreSQL client tools (pg_isready, psql) are missing; install postgresql"; return 1; }
  if ! _cs_pg_up; then
    _cs_log "PostgreSQL does not answer on 127.0.0.1:5432"
    _cs_pg_start || return 1
    _cs_wait PostgreSQL _cs_pg_up ||
      { _cs_fail "PostgreSQL did not answer on 127.0.0.1:5432 within ${COURIER_SERVICE_TIMEOUT:-120}s; see /var/log/postgresql/; start: pg_ctlcluster --skip-systemctl-redirect \$(ls /etc/postgresql) main start"; return 1; }
  else
    _cs_log "PostgreSQL answers"
  fi
  _cs_pg_logical || return 1
  if [ "${COURIER_FRESH_DATABASES:-}" = 1 ]; then
    # Every test creates tables of its own; a long-lived machine would pile them up run
    # after run. CI starts from an empty database instead.
    _cs_log "PostgreSQL: dropping courier_test for a fresh start (COURIER_FRESH_DATABASES=1)"
    _cs_as postgres psql -X -q -v ON_ERROR_STOP=1 -d postgres -c 'DROP DATABASE IF EXISTS courier_test WITH (FORCE)' </dev/null >&2 ||
      { _cs_fail "could not drop the PostgreSQL database courier_test"; return 1; }
  fi
  # Retried: a test of another checkout on this machine may create the database between
  # the NOT EXISTS check and the CREATE (then the second pass finds it).
  local attempt created=0
  for attempt in 1 2 3; do
    if _cs_as postgres psql -X -q -v ON_ERROR_STOP=1 -d postgres >&2 <<'SQL'
DO $$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'courier') THEN
    CREATE ROLE courier LOGIN CREATEDB PASSWORD 'courier';
  ELSE
    ALTER ROLE courier LOGIN CREATEDB PASSWORD 'courier';
  END IF;
  -- The log-tailing relay (@courier/pg-logical) opens a replication connection and creates
  -- its slot as this role: REPLICATION, granted every run (idempotent, restarts nothing).
  ALTER ROLE courier REPLICATION;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'courier_noperm') THEN
    CREATE ROLE courier_noperm LOGIN PASSWORD 'courier_noperm';
  END IF;
END
$$;
SELECT 'CREATE DATABASE courier_test OWNER courier'
  WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'courier_test')\gexec
ALTER DATABASE courier_test OWNER TO courier;
SQL
    then
      created=1
      break
    fi
    sleep 1
  done
  [ "$created" = 1 ] ||
    { _cs_fail "could not create the PostgreSQL role/database (as the postgres user through the socket)"; return 1; }
  psql -X -q -v ON_ERROR_STOP=1 "$COURIER_PG_URL" -c 'SELECT 1' </dev/null >/dev/null ||
    { _cs_fail "cannot connect to $COURIER_PG_URL"; return 1; }
  _cs_log "PostgreSQL ready: $COURIER_PG_URL"
}

# ---------------------------------------------------------------- MariaDB
_cs_maria_up() {
  # `ping` exits 0 whenever the server answers, even with "access denied".
  mariadb-admin --protocol=tcp -h 127.0.0.1 -P 3306 -u courier --connect-timeout=3 ping </dev/null >/dev/null 2>&1
}

_cs_maria_start() {
  [ -x /usr/sbin/mariadbd ] ||
    { _cs_fail "MariaDB is not installed here (no /usr/sbin/mariadbd); install mariadb-server or set COURIER_MARIADB_URL and COURIER_SERVICES=skip"; return 1; }
  _cs_log "starting MariaDB: start-stop-daemon --start --background --exec /usr/sbin/mariadbd -- --user=mysql"
  _cs_root install -d -o mysql -g mysql /run/mysqld || return 1
  _cs_root start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- \
    --user=mysql --log-error=/var/log/mysql/error.log </dev/null >&2 ||
    _cs_log "start-stop-daemon exited non-zero; waiting anyway"
}

_cs_maria_prepare() {
  command -v mariadb-admin >/dev/null 2>&1 ||
    { _cs_fail "MariaDB client tools (mariadb, mariadb-admin) are missing; install mariadb-client"; return 1; }
  if ! _cs_maria_up; then
    _cs_log "MariaDB does not answer on 127.0.0.1:3306"
    _cs_maria_start || return 1
    _cs_wait MariaDB _cs_maria_up ||
      { _cs_fail "MariaDB did not answer on 127.0.0.1:3306 within ${COURIER_SERVICE_TIMEOUT:-120}s; see /var/log/mysql/error.log"; return 1; }
  else
    _cs_log "MariaDB answers"
  fi
  if [ "${COURIER_FRESH_DATABASES:-}" = 1 ]; then
    _cs_log "MariaDB: dropping courier_test for a fresh start (COURIER_FRESH_DATABASES=1)"
    _cs_root mariadb -u root --protocol=socket -e 'DROP DATABASE IF EXISTS courier_test' </dev/null >&2 ||
      { _cs_fail "could not drop the MariaDB database courier_test"; return 1; }
  fi
  # The root account authenticates through the socket (unix_socket), so run as root.
  _cs_root mariadb -u root --protocol=socket >&2 <<'SQL' ||
CREATE DATABASE IF NOT EXISTS courier_test;
CREATE USER IF NOT EXISTS 'courier'@'127.0.0.1' IDENTIFIED BY 'courier';
CREATE USER IF NOT EXISTS 'courier'@'localhost' IDENTIFIED BY 'courier';
ALTER USER 'courier'@'127.0.0.1' IDENTIFIED BY 'courier';
ALTER USER 'courier'@'localhost' IDENTIFIED BY 'courier';
GRANT ALL PRIVILEGES ON `courier_test`.* TO 'courier'@'127.0.0.1', 'courier'@'localhost';
GRANT ALL PRIVILEGES ON `courier\_%`.* TO 'courier'@'127.0.0.1', 'courier'@'localhost';
FLUSH PRIVILEGES;
SQL
    { _cs_fail "could not create the MariaDB user/database (as root through the socket)"; return 1; }
  mariadb --protocol=tcp -h 127.0.0.1 -P 3306 -u courier -pcourier courier_test -e 'SELECT 1' </dev/null >/dev/null ||
    { _cs_fail "cannot connect to $COURIER_MARIADB_URL"; return 1; }
  _cs_log "MariaDB ready: $COURIER_MARIADB_URL"
}

# ---------------------------------------------------------------- RabbitMQ
_cs_rabbit_up() { _cs_tcp_open 5672; }

_cs_rabbit_start() {
  command -v rabbitmqctl >/dev/null 2>&1 ||
    { _cs_fail "RabbitMQ is not installed here (no rabbitmqctl); install rabbitmq-server or set COURIER_RABBITMQ_URL and COURIER_SERVICES=skip"; return 1; }
  # A node whose app was stopped (rabbitmqctl stop_app, as restart tests do) is still
  # running: start its app instead of a second node.
  if _cs_root timeout 30 rabbitmqctl -q ping </dev/null >/dev/null 2>&1; then
    _cs_log "RabbitMQ node is running but not listening: rabbitmqctl start_app"
    _cs_root timeout 120 rabbitmqctl start_app </dev/null >&2 || _cs_log "start_app exited non-zero; waiting anyway"
  else
    _cs_log "starting RabbitMQ: rabbitmq-server -detached"
    _cs_root rabbitmq-server -detached </dev/null >&2 || _cs_log "rabbitmq-server exited non-zero; waiting anyway"
  fi
  _cs_root timeout "${COURIER_SERVICE_TIMEOUT:-120}" rabbitmqctl await_startup </dev/null >&2 ||
    _cs_log "rabbitmqctl await_startup failed; waiting for the port anyway"
}

_cs_rabbit_prepare() {
  if ! _cs_rabbit_up; then
    _cs_log "RabbitMQ does not answer on 127.0.0.1:5672"
    _cs_rabbit_start || return 1
    _cs_wait RabbitMQ _cs_rabbit_up ||
      { _cs_fail "RabbitMQ did not answer on 127.0.0.1:5672 within ${COURIER_SERVICE_TIMEOUT:-120}s; see /var/log/rabbitmq/; start: rabbitmq-server -detached && rabbitmqctl await_startup"; return 1; }
  else
    _cs_log "RabbitMQ answers"
  fi
  _cs_log "RabbitMQ ready: $COURIER_RABBITMQ_URL"
}

# ---------------------------------------------------------------- NATS (JetStream)
# The port of COURIER_NATS_URL (nats://host:port).
_cs_nats_port() { local rest="${COURIER_NATS_URL##*:}"; printf '%s' "${rest%%/*}"; }

# JetStream answers when $JS.API.INFO gets an account_info_response (plain protocol over /dev/tcp).
_cs_nats_js_on() {
  local port="$1" reply
  # Captured, not piped into grep: the reader always ends by its timeout (status 124), and
  # under `set -o pipefail` (CI) that status would make the pipeline fail even on a match.
  reply="$(timeout 5 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port || exit 1
    printf 'CONNECT {\"verbose\":false,\"headers\":true,\"no_responders\":true}\r\nSUB _INBOX.courier 1\r\nPUB \$JS.API.INFO _INBOX.courier 0\r\n\r\n' >&3
    timeout 2 cat <&3" 2>/dev/null || true)"
  [[ "$reply" == *account_info_response* ]]
}
_cs_nats_up() { _cs_nats_js_on "$(_cs_nats_port)"; }

_cs_nats_start() {
  local port="$1" dir="$2"
  command -v nats-server >/dev/null 2>&1 ||
    { _cs_fail "nats-server is not installed here; install nats-server (Debian: apt-get install nats-server) or set COURIER_NATS_URL and COURIER_SERVICES=skip"; return 1; }
  _cs_log "starting NATS with JetStream: nats-server -a 127.0.0.1 -p $port -js -sd $dir"
  _cs_root install -d "$dir" || return 1
  # Matched by pid file, not by executable: another nats-server on another port is no reason not to start.
  _cs_root start-stop-daemon --start --oknodo --background --make-pidfile --pidfile "/run/courier-nats-$port.pid" \
    --exec "$(command -v nats-server)" -- \
    -a 127.0.0.1 -p "$port" -js -sd "$dir" -l "/var/log/nats-server-$port.log" </dev/null >&2 ||
    _cs_log "nats-server start exited non-zero; waiting anyway"
}

_cs_nats_prepare() {
  local port
  port="$(_cs_nats_port)"
  if _cs_nats_up; then
    _cs_log "NATS JetStream answers on $port"
  elif _cs_tcp_open "$port"; then
    # A server without JetStream is someone else's: leave it running, use our own on 4223.
    _cs_log "NATS on $port answers without JetStream; using a JetStream server on 4223"
    COURIER_NATS_URL="nats://127.0.0.1:4223"
    export COURIER_NATS_URL
    if ! _cs_nats_up; then
      _cs_nats_start 4223 /var/lib/courier-nats-4223 || return 1
      _cs_wait "NATS (4223)" _cs_nats_up || { _cs_fail "NATS JetStream did not answer on 4223; see /var/log/nats-server-4223.log"; return 1; }
    fi
  else
    _cs_log "NATS does not answer on $port"
    # Debian's store folder for the usual port (keeps what that server had), one of ours for others.
    local dir=/var/lib/nats-server
    [ "$port" = 4222 ] || dir="/var/lib/courier-nats-$port"
    _cs_nats_start "$port" "$dir" || return 1
    _cs_wait NATS _cs_nats_up ||
      { _cs_fail "NATS JetStream did not answer on $port within ${COURIER_SERVICE_TIMEOUT:-120}s; start: nats-server -a 127.0.0.1 -p $port -js -sd /var/lib/nats-server"; return 1; }
  fi
  _cs_log "NATS ready: $COURIER_NATS_URL"
}

# ---------------------------------------------------------------- Kafka
# scripts/kafka.sh probes the port, fetches the jars and starts the broker when needed, and
# fails with the reason (no Java, no Maven, a foreign process on the port, a start timeout).
_cs_kafka_prepare() {
  bash "$(dirname "${BASH_SOURCE[0]}")/kafka.sh" start </dev/null ||
    { _cs_fail "Kafka did not start on $COURIER_KAFKA_BROKERS; start it: bash scripts/kafka.sh start (needs Java 17+ and Maven), or point COURIER_KAFKA_BROKERS at a broker and set COURIER_SERVICES=skip"; return 1; }
  _cs_log "Kafka ready: $COURIER_KAFKA_BROKERS"
}

# ---------------------------------------------------------------- SQS (ElasticMQ)
# scripts/elasticmq.sh probes the endpoint, fetches the jars and starts the server when needed.
_cs_sqs_prepare() {
  bash "$(dirname "${BASH_SOURCE[0]}")/elasticmq.sh" start </dev/null ||
    { _cs_fail "SQS (ElasticMQ) did not start on $COURIER_SQS_ENDPOINT; start it: bash scripts/elasticmq.sh start (needs Java 17+ and Maven), or point COURIER_SQS_ENDPOINT at an SQS endpoint and set COURIER_SERVICES=skip"; return 1; }
  _cs_log "SQS ready: $COURIER_SQS_ENDPOINT"
}

# ---------------------------------------------------------------- Redis
# The port of COURIER_REDIS_URL (redis://host:port[/db]).
_cs_redis_port() { local rest="${COURIER_REDIS_URL##*:}"; rest="${rest%%/*}"; printf '%s' "${rest:-6379}"; }

# Redis answers when a PING over plain RESP gets +PONG (no redis-cli needed for the check).
_cs_redis_up() {
  local reply
  reply="$(timeout 3 bash -c "exec 3<>/dev/tcp/127.0.0.1/$(_cs_redis_port) || exit 1
    printf 'PING\r\n' >&3
    timeout 1 head -c 7 <&3" 2>/dev/null || true)"
  [[ "$reply" == +PONG* ]]
}

_cs_redis_prepare() {
  local port
  port="$(_cs_redis_port)"
  if _cs_redis_up; then
    _cs_log "Redis answers on $port"
  else
    _cs_log "Redis does not answer on $port"
    command -v redis-server >/dev/null 2>&1 ||
      { _cs_fail "redis-server is not installed here; install Redis 7 (Debian: apt-get install redis-server) or set COURIER_REDIS_URL and COURIER_SERVICES=skip"; return 1; }
    _cs_root install -d -o redis -g redis /var/lib/redis /var/log/redis 2>/dev/null || _cs_root install -d /var/lib/redis /var/log/redis || return 1
    _cs_log "starting Redis: redis-server --daemonize yes --bind 127.0.0.1 --port $port --save '' --appendonly no"
    _cs_root redis-server --daemonize yes --bind 127.0.0.1 --port "$port" --save "" --appendonly no \
      --dir /var/lib/redis --logfile /var/log/redis/ci.log </dev/null >&2 ||
      _cs_log "redis-server exited non-zero; waiting anyway"
    _cs_wait Redis _cs_redis_up ||
      { _cs_fail "Redis did not answer on $port within ${COURIER_SERVICE_TIMEOUT:-120}s; see /var/log/redis/ci.log; start: redis-server --daemonize yes --bind 127.0.0.1 --port $port --save '' --appendonly no"; return 1; }
  fi
  _cs_log "Redis ready: $COURIER_REDIS_URL"
}

# ---------------------------------------------------------------- main
# The browser the console tests drive: Debian's package, never a download of playwright's own.
_cs_chromium_prepare() {
  local chromium="${COURIER_CHROMIUM:-/usr/bin/chromium}"
  if [ ! -x "$chromium" ]; then
    _cs_log "installing Debian's chromium for the console's browser tests"
    { _cs_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1 ||
      { _cs_root apt-get update -q >/dev/null 2>&1 && _cs_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1; }; } ||
      { _cs_fail "Chromium is not installed and apt-get could not install it; install it (Debian: apt-get install chromium) or point COURIER_CHROMIUM at a Chromium binary"; return 1; }
  fi
  [ -x "$chromium" ] || { _cs_fail "no Chromium at $chromium after installing; point COURIER_CHROMIUM at one"; return 1; }
  COURIER_CHROMIUM="$chromium"
  export COURIER_CHROMIUM
}

courier_services_prepare() {
  : "${COURIER_PG_URL:=postgres://courier:courier@127.0.0.1:5432/courier_test}"
  : "${COURIER_MARIADB_URL:=mysql://courier:courier@127.0.0.1:3306/courier_test}"
  : "${COURIER_RABBITMQ_URL:=amqp://guest:guest@127.0.0.1:5672}"
  : "${COURIER_NATS_URL:=nats://127.0.0.1:4222}"
  : "${COURIER_KAFKA_BROKERS:=127.0.0.1:9092}"
  : "${COURIER_SQS_ENDPOINT:=http://127.0.0.1:9324}"
  : "${COURIER_REDIS_URL:=redis://127.0.0.1:6379}"
  export COURIER_PG_URL COURIER_MARIADB_URL COURIER_RABBITMQ_URL COURIER_NATS_URL COURIER_KAFKA_BROKERS COURIER_SQS_ENDPOINT COURIER_REDIS_URL
  if [ "${COURIER_SERVICES:-}" = "skip" ] || [ "${COURIER_TESTCONTAINERS:-}" = "1" ]; then
    _cs_log "not preparing local services (COURIER_SERVICES=${COURIER_SERVICES:-} COURIER_TESTCONTAINERS=${COURIER_TESTCONTAINERS:-})"
    return 0
  fi
  local failed=""
  _cs_pg_prepare || failed="$failed PostgreSQL"
  _cs_maria_prepare || failed="$failed MariaDB"
  _cs_rabbit_prepare || failed="$failed RabbitMQ"
  _cs_nats_prepare || failed="$failed NATS"
  _cs_kafka_prepare || failed="$failed Kafka"
  _cs_sqs_prepare || failed="$failed SQS"
  _cs_redis_prepare || failed="$failed Redis"
  _cs_chromium_prepare || failed="$failed Chromium"
  if [ -n "$failed" ]; then
    _cs_fail "not ready:$failed (see the messages above)"
    return 1
  fi
}

if (return 0 2>/dev/null); then
  # Sourced: prepare and leave the variables exported in the caller's shell.
  courier_services_prepare || return 1
else
  set -uo pipefail
  courier_services_prepare || exit 1
  printf 'export COURIER_PG_URL=%q\n' "$COURIER_PG_URL"
  printf 'export COURIER_MARIADB_URL=%q\n' "$COURIER_MARIADB_URL"
  printf 'export COURIER_RABBITMQ_URL=%q\n' "$COURIER_RABBITMQ_URL"
  printf 'export COURIER_NATS_URL=%q\n' "$COURIER_NATS_URL"
  printf 'export COURIER_KAFKA_BROKERS=%q\n' "$COURIER_KAFKA_BROKERS"
  printf 'export COURIER_SQS_ENDPOINT=%q\n' "$COURIER_SQS_ENDPOINT"
  printf 'export COURIER_REDIS_URL=%q\n' "$COURIER_REDIS_URL"
  if [ -n "${COURIER_CHROMIUM:-}" ]; then printf 'export COURIER_CHROMIUM=%q\n' "$COURIER_CHROMIUM"; fi
fi
