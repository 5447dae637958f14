"""What the benchmarks share: the doubles, the dev server and a real worker in processes of their
own; the kernel's memory figures from /proc; the ComfyUI double's output, made ready before a
measured download; and a `__main__` that exits cleanly.

A benchmark inserts the repository root into sys.path and then imports this module.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import sys
import tempfile
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, NoReturn

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from activities.comfyui.activities import ComfyUIActivities
from activities.comfyui.models import (
    ComfyUIFinished,
    ComfyUISubmit,
    ComfyUIWait,
    prompt_id_for,
)
from spillway.core.settings import PROJECT_ROOT
from spillway.sim.comfyui import ComfyUISim
from spillway.temporal import DEV_SERVER_ARGS, installed_binary, register_search_attributes

Process = asyncio.subprocess.Process


async def start_doubles(execution_s: float) -> tuple[Process, dict[str, str]]:
    """`python -m spillway.sim` (so the doubles do not share the measured process's CPU time) and
    the URLs it prints (plus `minimax_key`)."""
    sims = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "spillway.sim", "--execution-s", f"{execution_s:g}",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert sims.stdout is not None
    urls: dict[str, str] = json.loads(await sims.stdout.readline())
    return sims, urls


async def start_dev_server(server_defaults: bool = False) -> WorkflowEnvironment:
    """The real `temporal` dev server as `spillway dev` starts it (`server_defaults`: with the
    server's own dynamic config instead), with spillway's search attributes (jobs publish their
    state in them, and the benchmarks count jobs by it)."""
    env = await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter,
        dev_server_existing_path=installed_binary("temporal"),
        dev_server_extra_args=[] if server_defaults else list(DEV_SERVER_ARGS),
    )
    await register_search_attributes(env.client)
    return env


LEDGER_SECRET = secrets.token_hex(32)


async def start_worker(
    env: WorkflowEnvironment,
    queue: str,
    urls: dict[str, str],
    *command: str,
    **extra_env: str,
) -> Process:
    """A real `python worker.py` (or the `spillway` command given, e.g. `agent --host NAME`), so
    its RSS and sockets are its own; its output is dropped, as a benchmark prints only its
    figures."""
    program = (
        [str(Path(sys.executable).parent / "spillway"), *command]
        if command
        else [sys.executable, str(PROJECT_ROOT / "worker.py")]
    )
    return await asyncio.create_subprocess_exec(
        *program,
        env=os.environ | {
            "TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
            "SPILLWAY_TASK_QUEUE": queue,
            "COMFYUI_URL": urls["comfyui"],
            "MINIMAX_BASE_URL": urls["minimax"],
            "MINIMAX_API_KEY": urls["minimax_key"],
            # A worker holding a cloud key exits without it (the bench's workers share one).
            "SPILLWAY_LEDGER_SECRET": LEDGER_SECRET,
            "SPILLWAY_OUTPUT_DIR": tempfile.mkdtemp(prefix="spillway-bench-"),
        } | extra_env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip


def cpu_s(pid: int) -> float:
    """The CPU time (user + system) process `pid` has used so far, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child_pid(command: str) -> int:
    """This process's child running `command` (e.g. the `temporal` dev server the SDK started)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            name, rest = stat.read_text().split(") ", 1)
        except OSError:  # gone meanwhile
            continue
        if name.endswith(f"({command}") and int(rest.split()[1]) == os.getpid():
            return int(stat.parent.name)
    raise RuntimeError(f"no child process {command}")


def status_kib(field: str, pid: int | str = "self") -> int:
    """A kB field of /proc/PID/status: VmRSS now, VmHWM the peak."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/{pid}/status")


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    return status_kib(field, pid) / 1024


def reset_peak() -> bool:
    """Resets this process's VmHWM; False where the kernel does not allow it (the peak then
    includes whatever came before)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


async def serve_comfyui(size: int) -> None:
    """The ComfyUI double for a child process: instant outputs of `size` bytes, its URL on stdout
    for the parent, then serves until killed."""
    async with ComfyUISim() as sim:
        sim.execution_s, sim.output_bytes = 0, size
        print(sim.url, flush=True)
        await asyncio.Event().wait()


async def comfyui_finished(
    environment: ActivityEnvironment, acts: ComfyUIActivities, job: str, graph: dict[str, Any]
) -> ComfyUIFinished:
    """Submits `graph` and waits for its outputs, so that only the download is measured."""
    run_id = environment.info.workflow_run_id or "bench"
    submit = ComfyUISubmit(job_id=job, prompt_id=prompt_id_for(job, 1, run_id), graph=graph)
    await environment.run(acts.submit, submit)
    wait = ComfyUIWait(job_id=job, prompt_id=submit.prompt_id)
    finished: ComfyUIFinished = await environment.run(acts.wait, wait)
    return finished


def run_main(main: Coroutine[Any, Any, None]) -> NoReturn:
    asyncio.run(main)
    sys.stdout.flush()
    os._exit(0)  # the SDK's bridge can crash at interpreter shutdown (sdk-python#300)
