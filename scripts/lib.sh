# Shared helpers for the repository's shell scripts. Source it; it defines functions only
# (plus COURIER_ROOT and PATH), so sourcing it twice is harmless.
#
#   courier_step TEXT       print a step heading
#   courier_use_node MAJOR  put Node MAJOR (from the cache, scripts/node.sh) first on PATH
#   courier_ensure_node     a supported Node first on PATH: COURIER_NODE if set, else the one
#                           running if it is supported, else COURIER_NODE_DEFAULT from the cache
#   courier_ensure_pnpm     ensure_node, then make `pnpm` the pinned version (global if it
#                           already is, else .tools/)
#   courier_install         ensure pnpm, then `pnpm install --frozen-lockfile`
#   courier_setup           courier_install + prepare the services (scripts/services.sh), once

COURIER_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
COURIER_PNPM_VERSION="12.4.2"
# The Node.js lines Courier supports and CI tests (README "Supported platforms"); the
# default is the line CI runs the whole suite on, and the one installed when the machine's
# own Node is older than every supported line.
COURIER_NODE_LINES="22 24 26"
COURIER_NODE_DEFAULT="26"
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

# Puts Node MAJOR (installed from the npm registry into ~/.cache/courier by scripts/node.sh)
# first on PATH, so that `node`, npm's and pnpm's scripts and the tests all run on it: pnpm
# 12 is a native executable that runs `node` from PATH for scripts, engine checks and bins.
courier_use_node() {
  local bin
  bin="$(bash "$COURIER_ROOT/scripts/node.sh" "$1")" || courier_die "could not install Node.js $1 (scripts/node.sh $1)"
  case ":$PATH:" in
    *":$bin:"*) PATH="$bin:${PATH//":$bin:"/:}" ;;
    *) PATH="$bin:$PATH" ;;
  esac
  export PATH
  hash -r
  export COURIER_NODE="$1"
  # Native addons (better-sqlite3) build with node-gyp when no prebuilt binary can be fetched
  # (github.com is not reachable here). node-gyp would download this Node's headers from
  # nodejs.org (not reachable either) or, given /usr, build against the system Node's headers —
  # another ABI, which fails to load. The registry's Node package carries its own headers
  # (include/node), so the addon is built for the Node that runs it.
  if [ -d "$bin/../include/node" ]; then
    npm_config_nodedir="$(cd "$bin/.." && pwd)"
    export npm_config_nodedir
  fi
}

# True when `node` on PATH is in the supported range (the `engines` of every package.json:
# ^22.12.0 || ^24.0.0 || >=26.0.0; 23 and 25 are short-lived lines, past their end of life).
courier_node_supported() {
  node -e '
    const [major, minor] = process.versions.node.split(".").map(Number);
    process.exit((major === 22 && minor >= 12) || major === 24 || major >= 26 ? 0 : 1);
  ' 2>/dev/null </dev/null
}

courier_ensure_node() {
  command -v node >/dev/null 2>&1 || courier_die "node is not installed: Courier's scripts need a Node.js with npm to start (they install Node $COURIER_NODE_DEFAULT themselves when that one is outside the supported range)"
  if [ -n "${COURIER_NODE:-}" ]; then
    if [ "$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null </dev/null)" != "$COURIER_NODE" ]; then
      courier_use_node "$COURIER_NODE"
    fi
  elif ! courier_node_supported; then
    echo "node $(node --version </dev/null) is not a supported line (^22.12.0 || ^24.0.0 || >=26.0.0): using Node $COURIER_NODE_DEFAULT from the cache (scripts/node.sh)"
    courier_use_node "$COURIER_NODE_DEFAULT"
  fi
}

courier_ensure_pnpm() {
  courier_ensure_node
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
