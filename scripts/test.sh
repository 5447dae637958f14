#!/usr/bin/env bash
# The test command (README, CI): sets up .venv if needed, then lint, format check, types, the
# layers contract (import-linter) and the tests. docs/testing.md says what each lane holds.
#   --fast        the unit lane only (no dev server, no worker processes, no reliability scenarios)
#   --durations   also print the 30 slowest tests with their seconds
#   --under-load  only the tests that run a Temporal server, while two busy processes hold both
#                 cores (what a shared CI machine does to them); lint and types are skipped
# Other arguments go to pytest, e.g. scripts/test.sh -k guard, scripts/test.sh --fast -x
set -euo pipefail
cd "$(dirname "$0")/.."
args=()
checks=1
busy=0
while [ $# -gt 0 ]; do
  case "$1" in
    --fast) args+=(-m "not full") ;;
    --durations) args+=(--durations=30) ;;
    --under-load) args+=(-m server); checks=0; busy=2 ;;
    *) break ;;
  esac
  shift
done
source scripts/venv.sh
if [ "$checks" = 1 ]; then
  .venv/bin/ruff check .
  .venv/bin/ruff format --check .
  .venv/bin/mypy
  .venv/bin/lint-imports --no-logo
fi
hogs=()
for _ in $(seq 1 "$busy"); do
  .venv/bin/python -c 'while True: pass' &
  hogs+=($!)
done
trap '[ ${#hogs[@]} -eq 0 ] || kill "${hogs[@]}" 2>/dev/null' EXIT
.venv/bin/pytest "${args[@]}" "$@"
