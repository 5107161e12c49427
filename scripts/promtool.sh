#!/usr/bin/env bash
# Prometheus's `promtool`, for the tests that check and unit-test Courier's alert rules
# (docs/alerts/). No npm package ships it; Debian's `prometheus` package does (2.42 on
# bookworm), so it is fetched with `apt-get download` and unpacked with `dpkg -x` into a
# cache outside git — nothing is installed, no service is started.
#
# Usage:
#   bash scripts/promtool.sh path     fetch if needed, print the promtool binary's path
#   bash scripts/promtool.sh fetch    only fetch
#   bash scripts/promtool.sh <args>   run promtool with these arguments (e.g. check rules f.yml)
#
# Environment:
#   COURIER_PROMETHEUS_HOME  cache folder (default ~/.cache/courier/prometheus)
#   COURIER_PROMETHEUS_DEB   a .deb to unpack instead of downloading one (an offline mirror)
# Fails loudly (exit 1, saying why) when it cannot get the package: the tests that need it
# fail rather than skip, so CI never passes without having run them.
set -euo pipefail

home="${COURIER_PROMETHEUS_HOME:-$HOME/.cache/courier/prometheus}"
bin="$home/root/usr/bin/promtool"

die() { printf '\033[31mpromtool: %s\033[0m\n' "$*" >&2; exit 1; }

fetch() {
  [[ -x "$bin" ]] && return 0
  command -v dpkg >/dev/null || die "dpkg is missing: this script unpacks Debian's prometheus package (Debian/Ubuntu only)"
  mkdir -p "$home"
  local work deb
  work="$(mktemp -d "$home/fetch.XXXXXX")"
  trap 'rm -rf "$work"' RETURN
  if [[ -n "${COURIER_PROMETHEUS_DEB:-}" ]]; then
    deb="$COURIER_PROMETHEUS_DEB"
  else
    command -v apt-get >/dev/null || die "apt-get is missing: set COURIER_PROMETHEUS_DEB to a prometheus .deb"
    # apt writes into the current folder; a clean machine may have no package index yet.
    if ! (cd "$work" && apt-get download prometheus >"$work/apt.log" 2>&1); then
      printf '  promtool: apt-get download failed; refreshing the package index once\n' >&2
      apt-get update >"$work/update.log" 2>&1 || die "apt-get update failed: $(tail -3 "$work/update.log")"
      (cd "$work" && apt-get download prometheus >"$work/apt.log" 2>&1) || die "apt-get download prometheus failed: $(tail -3 "$work/apt.log")"
    fi
    deb="$(ls "$work"/prometheus_*.deb 2>/dev/null | head -1)"
    [[ -n "$deb" ]] || die "apt-get download left no prometheus_*.deb in $work"
  fi
  rm -rf "$home/root.new"
  dpkg -x "$deb" "$home/root.new" || die "dpkg -x $deb failed"
  [[ -x "$home/root.new/usr/bin/promtool" ]] || die "$deb has no usr/bin/promtool"
  # Moved into place whole, so a fetch interrupted half-way never leaves a broken binary.
  rm -rf "$home/root"
  mv "$home/root.new" "$home/root"
  "$bin" --version >/dev/null 2>&1 || die "the unpacked promtool does not run: $("$bin" --version 2>&1 | tail -1)"
}

case "${1:-path}" in
  path) fetch; printf '%s\n' "$bin" ;;
  fetch) fetch ;;
  *) fetch; exec "$bin" "$@" ;;
esac
