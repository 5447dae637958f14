#!/usr/bin/env bash
# The test command (README, CI): sets up .venv if needed, then lint, format check, types, tests.
# Extra arguments go to pytest, e.g. scripts/test.sh -k guard
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/pytest "$@"
