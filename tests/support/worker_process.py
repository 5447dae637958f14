"""`python worker.py` as a real process that a test can SIGKILL and start again, against the dev
server and the doubles running in the test process. Its output is kept (to look for leaks).
Loaded by conftest: `await worker_process(**env)` starts one on its own task queue;
`await cloud_worker(**env)` one whose A40 is busy and whose fallback is armed (every job goes to
the cloud: MiniMax, unless `env` names other providers).
`kill_after_the_create_answer(worker, job, cloud)` kills a worker the moment the cloud double made
the job's task, starts it again and checks how the job ended.

`worker_env` is the environment every worker process of the tests runs with (FAST_WORKER:
production logic on a test's clock); FAST_CLOUD adds what a worker needs to reach the MiniMax
double quickly."""

from __future__ import annotations

import asyncio
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from spillway.core.models import Plan
from spillway.core.settings import PROJECT_ROOT
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.kling import KlingSim
from spillway.sim.minimax import MiniMaxSim
from tests.support.constants import BUSY_VRAM_PCT, CANARY_KEY, LEDGER_SECRET
from tests.support.waiting import until

FAST_WORKER = {
    # A worker holding a key does not start without it (a test that removes it says so).
    "SPILLWAY_LEDGER_SECRET": LEDGER_SECRET,
    "SPILLWAY_HEARTBEAT_TIMEOUT_S": "2",
    "LOAD_PROBE_TIMEOUT_S": "1",
    "UNREACHABLE_CONFIRM_S": "1",
}
FAST_CLOUD = {
    "MINIMAX_API_KEY": CANARY_KEY,
    "MINIMAX_POLL_INTERVAL_S": "0.2",
    "MINIMAX_CREATE_TIMEOUT_S": "2",
}


def worker_env(
    cli_env: Callable[..., dict[str, str]],
    *,
    address: str,
    task_queue: str,
    outputs: Path,
    **overrides: Any,
) -> dict[str, str]:
    """FAST_WORKER, the server, task queue and output folder, then `overrides` (any values,
    written as text), on top of `cli_env`'s clean environment."""
    place = {
        "TEMPORAL_ADDRESS": address,
        "SPILLWAY_TASK_QUEUE": task_queue,
        "SPILLWAY_OUTPUT_DIR": str(outputs),
    }
    return cli_env(**FAST_WORKER | place | {k: str(v) for k, v in overrides.items()})


class WorkerProcess:
    """`python worker.py` by default; `args` runs the `spillway` command instead (e.g. `agent
    --host NAME`, `worker --no-agents`), `module` a module of the project (`python -m`)."""

    def __init__(
        self, env: dict[str, str], args: list[str] | None = None, module: str | None = None
    ) -> None:
        self.env, self.args, self.module = env, args, module
        self.task_queue = env["SPILLWAY_TASK_QUEUE"]
        self.output: list[str] = []
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    @property
    def log(self) -> str:
        return "".join(self.output)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    def send_signal(self, sig: signal.Signals) -> None:
        assert self._proc is not None
        self._proc.send_signal(sig)

    async def start(self) -> None:
        if self.args:
            command = [str(Path(sys.executable).parent / "spillway"), *self.args]
        elif self.module:
            command = [sys.executable, "-m", self.module]
        else:
            command = [sys.executable, str(PROJECT_ROOT / "worker.py")]
        proc = await asyncio.create_subprocess_exec(
            *command,
            env=self.env,
            cwd=PROJECT_ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        ready = asyncio.Event()
        self._proc, self._reader = proc, asyncio.create_task(self._read(proc, ready))
        waiter = asyncio.create_task(ready.wait())
        await asyncio.wait({waiter, self._reader}, timeout=30, return_when="FIRST_COMPLETED")
        waiter.cancel()
        if not ready.is_set():
            raise AssertionError(f"worker did not start:\n{self.log}")

    async def _read(self, proc: asyncio.subprocess.Process, ready: asyncio.Event) -> None:
        assert proc.stdout is not None
        async for line in proc.stdout:
            text = line.decode(errors="replace")
            self.output.append(text)
            if "worker polling" in text:
                ready.set()

    async def kill(self) -> None:
        """SIGKILL: no cleanup, no graceful shutdown, like a power cut."""
        await self._end(signal.SIGKILL)

    async def stop(self) -> None:
        await self._end(signal.SIGTERM)

    async def _end(self, sig: signal.Signals) -> None:
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        if proc.returncode is None:
            proc.send_signal(sig)
        await asyncio.wait_for(proc.wait(), timeout=30)
        if self._reader is not None:
            await self._reader


@pytest.fixture
async def worker_process(
    cli_env: Callable[..., dict[str, str]], dev_env: WorkflowEnvironment, tmp_path: Path
) -> AsyncIterator[Callable[..., Any]]:
    """`await worker_process(**env)` starts a worker process on its own task queue of the dev
    server; every one started is killed at the end."""
    started: list[WorkerProcess] = []

    async def start(**overrides: Any) -> WorkerProcess:
        env = worker_env(
            cli_env,
            address=dev_env.client.service_client.config.target_host,
            task_queue=f"proc-{uuid.uuid4()}",
            outputs=tmp_path / "outputs",
            **overrides,
        )
        worker = WorkerProcess(env)
        await worker.start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        await worker.kill()


@pytest.fixture
def cloud_worker(
    worker_process: Callable[..., Any], comfyui: ComfyUISim, minimax: MiniMaxSim
) -> Callable[..., Any]:
    """`await cloud_worker(**env)`: a worker process whose A40 is overloaded and whose fallback
    is armed, on the MiniMax double with FAST_CLOUD."""
    comfyui.set_vram_used_pct(BUSY_VRAM_PCT)

    async def start(**overrides: Any) -> WorkerProcess:
        armed = {
            "COMFYUI_URL": comfyui.url,
            "CLOUD_VIDEO_FALLBACK_ENABLED": "1",
            "MINIMAX_BASE_URL": minimax.url,
        }
        worker: WorkerProcess = await worker_process(**FAST_CLOUD | armed | overrides)
        return worker

    return start


async def kill_after_the_create_answer(
    worker: WorkerProcess, job: WorkflowHandle[Any, Plan], cloud: MiniMaxSim | KlingSim
) -> None:
    """SIGKILL the worker as soon as the provider's double made the job's task (the answer is on
    its way, or read, or the activity just completed) and start it again: the job completes, or
    fails saying a charge may exist, and never creates again (the test counts the creates)."""
    await until(lambda: cloud.tasks_created >= 1, timeout_s=30)
    await worker.kill()
    await worker.start()
    try:
        plan = await asyncio.wait_for(job.result(), 90)
        assert plan.state == "completed"
    except WorkflowFailureError as err:
        assert isinstance(err.cause, ApplicationError) and "a charge may exist" in err.cause.message
