#!/usr/bin/env bash
# Runs the example service (examples/orders-payments) on a fresh machine in one command:
# installs pnpm and the dependencies if needed, prepares the services, then runs the
# example's `start` script. Arguments go to the example (e.g. its setup choice).
#
# The default setup (sqlite-sql: separate worker processes over one SQLite file and the
# SQL transport) and the in-memory and SQLite setups need no server: with no setup, or
# `sqlite-sql`, `in-memory` or `sqlite` (first argument, `--setup`, or
# COURIER_EXAMPLE_SETUP), or COURIER_SERVICES=skip, no service is touched. Otherwise
# (postgres-rabbitmq, postgres-kafka, postgres-sqs) the services are prepared when the machine
# has them (Kafka through scripts/kafka.sh, SQS as ElasticMQ through scripts/elasticmq.sh: Java
# 17+ and Maven; SNS is a stand-in the example starts itself), and a failure there is only a
# warning: the example itself says what it needs.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$COURIER_ROOT"

example_dir="examples/orders-payments"
if [ ! -f "$example_dir/package.json" ]; then
  courier_die "$example_dir has no package.json yet: the example (@courier/example-orders-payments, script 'start') is not written"
fi

if [ "${COURIER_SETUP_DONE:-}" != "1" ]; then
  courier_step "install pnpm $COURIER_PNPM_VERSION and dependencies"
  courier_install
  # The setup comes first (`sqlite`), or as `--setup sqlite` / `--setup=sqlite`, or from
  # COURIER_EXAMPLE_SETUP; none given means the default, sqlite-sql, which needs no server.
  setup="${COURIER_EXAMPLE_SETUP:-}"
  case "${1:-}" in in-memory | memory | sqlite | sqlite-sql | postgres-rabbitmq | postgres-kafka | postgres-rabbitmq-nest | postgres-sqs) setup="$1" ;; esac
  previous=""
  for arg in "$@"; do
    case "$previous:$arg" in
      --setup:*) setup="$arg" ;;
      *:--setup=*) setup="${arg#--setup=}" ;;
    esac
    previous="$arg"
  done
  case "$setup" in
    "" | in-memory | memory | sqlite | sqlite-sql) export COURIER_SERVICES=skip ;;
  esac
  courier_step "prepare services"
  # shellcheck source=services.sh
  source scripts/services.sh ||
    echo "warning: services are not ready; a setup that needs PostgreSQL, RabbitMQ or Kafka will fail" >&2
fi

courier_step "example: pnpm --filter @courier/example-orders-payments start $*"
exec pnpm --filter @courier/example-orders-payments start "$@"
