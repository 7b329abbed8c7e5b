#!/usr/bin/env bash
# Set up and run everything CI runs: lint, format, types, import contracts, the whole test
# suite against real PostgreSQL and Redis servers (installed from Debian packages if missing).
# Extra arguments go to pytest (e.g. tests/store -x).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --dev
./scripts/install-services.sh
export DIAGNOSER_TEST_REQUIRE_SERVICES=1

echo "== ruff check" && .venv/bin/ruff check .
echo "== ruff format --check" && .venv/bin/ruff format --check .
echo "== mypy --strict" && .venv/bin/mypy diagnoser tests bench examples
echo "== import contracts" && .venv/bin/lint-imports
# Four workers on this project's two-core machines: most service tests wait on timers, polls
# and child processes rather than the CPU (a fresh-clone run: 2 workers 23 min, 4 workers 20 min,
# both on a machine shared with other work, so the unloaded times are shorter). Whole
# files per worker, so a file's module-scoped servers start once; DIAGNOSER_TEST_WORKERS=0 runs
# in one process.
workers="${DIAGNOSER_TEST_WORKERS:-4}"
echo "== pytest (workers: $workers)" && .venv/bin/pytest -n "$workers" --dist loadfile --durations=25 "$@"
