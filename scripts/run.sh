#!/usr/bin/env bash
# Set up and start diagnoser on its embedded default: SQLite under ./data, 127.0.0.1:8080.
# Extra arguments go to `diagnoser serve` (e.g. --port 9000).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/diagnoser serve "$@"
