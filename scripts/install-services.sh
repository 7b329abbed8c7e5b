#!/usr/bin/env bash
# Install the PostgreSQL and Redis servers the test suite starts, from Debian packages,
# when they are missing. Idempotent; needs root (or sudo) only when something is missing.
set -euo pipefail

need=()
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || command -v initdb >/dev/null \
  || need+=(postgresql)
command -v redis-server >/dev/null || need+=(redis-server)
command -v runuser >/dev/null || need+=(util-linux)

if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "error: need root to install: ${need[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "installing ${need[*]} from Debian packages" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# Debian starts the packaged services; the suite runs its own throwaway servers instead.
if command -v service >/dev/null; then
  $sudo service redis-server stop >/dev/null 2>&1 || true
  $sudo service postgresql stop >/dev/null 2>&1 || true
fi
