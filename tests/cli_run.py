"""Running the `spillway` console script from a test, as people and scripts do."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

SPILLWAY = str(Path(sys.executable).parent / "spillway")


async def spillway(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    # Asynchronous, so the doubles in this process keep answering while the command runs.
    proc = await asyncio.create_subprocess_exec(
        SPILLWAY, *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def one_line(stderr: str) -> str:
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    return stderr
