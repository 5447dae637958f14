#!/usr/bin/env bash
# The embedded default from a fresh clone: sets up .venv if needed, then runs
# `spillway dev --simulate` (Temporal dev server + Web UI, worker, simulators). Arguments go to it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
exec .venv/bin/spillway dev --simulate "$@"
