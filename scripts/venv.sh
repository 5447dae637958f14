# Sourced by the scripts beside it: makes sure .venv exists and holds the pinned dependencies
# (requirements.lock) and the project itself, editable, with its dev extras. Re-installs only
# when pyproject.toml or requirements.lock changed.
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "spillway needs Python >= 3.11; point PYTHON at one (PYTHON=python3.12 $0)" >&2
    exit 2
  fi
  echo "creating .venv with $("$PYTHON" --version)" >&2
  "$PYTHON" -m venv .venv
fi
_wanted=$(cat pyproject.toml requirements.lock | sha256sum | cut -d' ' -f1)
if [ "$(cat .venv/.spillway-installed 2>/dev/null)" != "$_wanted" ]; then
  echo "installing dependencies into .venv (requirements.lock)" >&2
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -c requirements.lock -e '.[dev]'
  echo "$_wanted" > .venv/.spillway-installed
fi
