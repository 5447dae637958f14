#!/usr/bin/env bash
# The test command (README, CI): sets up .venv if needed, then lint, format check, types, the
# layers contract (import-linter) and the tests, in four processes that each take whole files
# (pytest-xdist; most tests wait on a server, a timer or a process, so four share two cores well).
# docs/testing.md says what each lane holds.
#   --fast        the unit lane only (no dev server, no worker processes, no reliability scenarios)
#   --durations   also print the 30 slowest tests with their seconds
#   --under-load  only the tests that run a Temporal server, while two busy processes hold both
#                 cores (what a shared CI machine does to them); lint and types are skipped
# Other arguments go to pytest, e.g. scripts/test.sh -k guard, scripts/test.sh --fast -x;
# -n 0 runs the tests in this one process (what --pdb and -s need), -n 2 in two.
set -euo pipefail
cd "$(dirname "$0")/.."
args=(-n 4 --dist loadfile)
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
# The console's browser tests drive Debian's Chromium (tests/support/browser.py) and never skip:
# install it where it is missing and this shell may (CI runs as root on Debian).
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing chromium for the console's browser tests (apt-get)" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >&2
  else
    echo "no chromium: the console's browser tests will fail; install it (apt-get install" \
      "chromium) or leave them out with --fast" >&2
  fi
fi
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
# pytest's stderr is kept too: when a native crash kills it (exit 139), the thread that crashed
# is printed again last, where a log's tail shows it (faulthandler prints every thread first).
stderr_log=$(mktemp)
trap '[ ${#hogs[@]} -eq 0 ] || kill "${hogs[@]}" 2>/dev/null; rm -f "$stderr_log"' EXIT
status=0
{ .venv/bin/pytest "${args[@]}" "$@" 2>&1 1>&3 3>&- | tee "$stderr_log" >&2; } 3>&1 || status=$?
if [ "$status" -gt 128 ]; then
  echo "pytest died of signal $((status - 128)); the crashed thread, as faulthandler saw it:" >&2
  if grep -q '^Current thread' "$stderr_log"; then
    awk '/^Current thread/{p=1} p&&(/^$/||++n>16){exit} p' "$stderr_log" >&2
  else
    echo "  none held the interpreter: a native thread (the Temporal core's or a C extension's)" \
      "crashed; the main thread was at:" >&2
    awk '/^Thread 0x/{n=0; block=""} {n++; if (n<=10) block=block $0 "\n"} END{printf "%s", block}' \
      "$stderr_log" >&2
  fi
fi
exit "$status"
