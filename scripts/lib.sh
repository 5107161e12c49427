# Shared helpers for the repository's shell scripts. Source it; it defines functions only
# (plus COURIER_ROOT and PATH), so sourcing it twice is harmless.
#
#   courier_step TEXT       print a step heading
#   courier_ensure_pnpm     make `pnpm` the pinned version (global if it already is, else .tools/)
#   courier_install         ensure pnpm, then `pnpm install --frozen-lockfile`
#   courier_setup           courier_install + prepare the services (scripts/services.sh), once

COURIER_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
COURIER_PNPM_VERSION="12.4.2"
export COURIER_ROOT
# A pnpm installed into .tools/ by an earlier run wins over a wrong global one.
case ":$PATH:" in
  *":$COURIER_ROOT/.tools/node_modules/.bin:"*) ;;
  *) PATH="$COURIER_ROOT/.tools/node_modules/.bin:$PATH"; export PATH ;;
esac

courier_step() {
  printf '\n\033[1m==> %s\033[0m  (%s)\n' "$*" "$(date +%H:%M:%S)"
}

courier_die() {
  printf '\033[31mERROR: %s\033[0m\n' "$*" >&2
  exit 1
}

courier_ensure_pnpm() {
  command -v node >/dev/null 2>&1 || courier_die "node is not installed: Courier needs Node.js >= 20.19 (with npm)"
  local have=""
  have="$(pnpm --version 2>/dev/null </dev/null || true)"
  if [ "$have" = "$COURIER_PNPM_VERSION" ]; then
    return 0
  fi
  echo "pnpm ${have:-missing}; installing pnpm@$COURIER_PNPM_VERSION into $COURIER_ROOT/.tools"
  mkdir -p "$COURIER_ROOT/.tools"
  npm install --prefix "$COURIER_ROOT/.tools" --no-save --no-audit --no-fund --loglevel=error \
    "pnpm@$COURIER_PNPM_VERSION" </dev/null
  hash -r
  have="$(pnpm --version 2>/dev/null </dev/null || true)"
  [ "$have" = "$COURIER_PNPM_VERSION" ] || courier_die "pnpm@$COURIER_PNPM_VERSION did not install (found '${have:-nothing}')"
}

courier_install() {
  courier_ensure_pnpm
  (cd "$COURIER_ROOT" && pnpm install --frozen-lockfile </dev/null)
}

# Installs dependencies and prepares the services once per process tree: a script called
# by another that already did it (COURIER_SETUP_DONE=1) skips the work.
courier_setup() {
  if [ "${COURIER_SETUP_DONE:-}" = "1" ]; then
    return 0
  fi
  courier_step "install pnpm $COURIER_PNPM_VERSION and dependencies"
  courier_install
  courier_step "prepare services (PostgreSQL, MariaDB, RabbitMQ, NATS, Kafka)"
  # shellcheck source=services.sh
  source "$COURIER_ROOT/scripts/services.sh" || courier_die "services are not ready"
  export COURIER_SETUP_DONE=1
}
