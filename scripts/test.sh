#!/usr/bin/env bash
# Set up everything the test suite needs on a fresh machine, then run it.
# System package: tmux (the terminal tests drive a real terminal). Python: a venv with the test extras.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v tmux >/dev/null; then
    if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq tmux >/dev/null
    else sudo apt-get update -qq && sudo apt-get install -y -qq tmux >/dev/null; fi
fi
python3 -m venv .venv
.venv/bin/pip install -q -e '.[test]'
exec .venv/bin/python -m pytest -q "$@"
