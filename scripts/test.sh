#!/usr/bin/env bash
# Runs Courier's tests on a fresh machine in one command: installs pnpm and the
# dependencies if needed, prepares PostgreSQL, MariaDB and RabbitMQ (scripts/services.sh),
# then runs `pnpm test` (every package's vitest project, then the serial restart project).
# Arguments are passed to the first vitest run, e.g. `bash scripts/test.sh --project core`.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
courier_setup
courier_step "test: pnpm test"
cd "$COURIER_ROOT"
if [ "$#" -gt 0 ]; then
  pnpm exec vitest run "$@"
else
  pnpm test
fi
