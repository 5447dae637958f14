"""The `spillway` command (docs/design.md, "The command-line contract").

Exit codes: 0 success, 1 refused or failed, 2 bad input, usage or configuration; errors are one
line on stderr, never a traceback (SPILLWAY_DEBUG=1 shows it). Every run leaves through
`os._exit`: the SDK's native bridge can crash a client process during interpreter shutdown
(temporalio/sdk-python#300), which would turn a success into a crash exit.
"""

from __future__ import annotations

import asyncio
import os
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

from spillway.cli.parser import USAGE, build_parser
from spillway.core.errors import ConfigError, Failed
from spillway.core.exits import leave

OK, FAILED = 0, 1


def run(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else USAGE
    try:
        code: int = asyncio.run(args.run(args))
        return code
    except ConfigError as exc:
        return _fail(USAGE, str(exc))
    except Failed as exc:
        return _fail(FAILED, str(exc))
    except KeyboardInterrupt:
        return _fail(130, "interrupted")
    except BrokenPipeError:  # `spillway list | head`: the reader has all it wanted
        return OK
    except Exception as exc:
        if os.environ.get("SPILLWAY_DEBUG"):
            traceback.print_exc()
        return _fail(FAILED, f"unexpected error: {type(exc).__name__}: {exc}")


def _fail(code: int, message: str) -> int:
    print(f"spillway: {message}", file=sys.stderr)
    return code


def main() -> NoReturn:
    leave(run())
