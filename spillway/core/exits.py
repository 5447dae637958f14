"""How a short-lived spillway process leaves: the `spillway` command and `python worker.py` both
do, so it lives below both (neither imports the other for it)."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import NoReturn


def leave(code: int) -> NoReturn:
    """Exits with `code` once the output is out, without the interpreter's shutdown: the SDK's
    native bridge can crash a client process during it (temporalio/sdk-python#300), which would
    turn a success into a crash exit."""
    with contextlib.suppress(BrokenPipeError):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)
