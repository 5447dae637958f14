#!/usr/bin/env bash
# The test command (README, CI): sets up .venv if needed, then lint, format check, types, the
# layers contract (import-linter) and the tests. `--fast` first: the unit lane only (no dev
# server, no worker processes, no reliability scenarios). Other arguments go to pytest, e.g.
# scripts/test.sh -k guard, scripts/test.sh --fast -x
set -euo pipefail
cd "$(dirname "$0")/.."
lane=()
if [ "${1:-}" = "--fast" ]; then
  shift
  lane=(-m "not full")
fi
source scripts/venv.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/lint-imports --no-logo
.venv/bin/pytest "${lane[@]}" "$@"
