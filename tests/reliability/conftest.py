"""Fixtures of the reliability suite (issue 7): one Temporal dev server process for the session
(Web UI included, so its API can be read), worker processes on it, the session's `sightings`,
and `killed_mid_download`, the download-kill scenario the worker and the agent both go through.
The secrets scenario runs after the others of its process; when the session's server stops,
everything the process's scenarios left is checked for the key again (the suite runs in several
processes: scripts/test.sh). At the end every run on every DevServer is replayed
(`DevServerGuards`, tests/support/replay_guard.py).

`slow` marks the scenarios a quick local run skips (`pytest -m "not slow"`); CI runs them all.
The spend ledger's scenarios start their workers with `ledger_workers`: each runs twice, with
the workers' workflow cache and without one (every workflow task replays its whole history).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from tests.reliability.harness import (
    BIG_VIDEO_BYTES,
    SECRETS,
    WORKER_DEFAULTS,
    DevServer,
    Sightings,
    Worker,
    assert_whole_video_fetched_again,
    kill_mid_download,
    posts_of,
)
from tests.support.jobs import Jobs
from tests.support.replay_guard import ServerGuard
from tests.support.worker_process import worker_env


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slow: a long reliability scenario; CI runs it, `-m 'not slow'` skips it"
    )


@pytest.fixture(scope="session")
def sightings() -> Sightings:
    return Sightings()


class DevServerGuards:
    """A replay guard (tests/support/replay_guard.py) for every DevServer the session starts,
    the session's and any a test starts of its own, by its SQLite file: its client (the one
    tests, and in-process workers, use) notes what it starts and runs. At the end every run on
    each is replayed: on the server if still running, else on the server started again on its
    file (which keeps every run)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.guards: dict[Path, tuple[DevServer, ServerGuard]] = {}
        self.start = DevServer.start

    async def started(self, server: DevServer) -> None:
        await self.start(server)
        if server.db not in self.guards:
            name = f"the reliability dev server {server.db.parent.name}/{server.db.name}"
            self.guards[server.db] = (server, ServerGuard(name, listable=True))
        guard = self.guards[server.db][1]
        server._client = guard.recording(server.client)

    async def check(self, server: DevServer) -> None:
        guard = self.guards[server.db][1]
        if guard.checked:
            return
        try:
            client = server.client
        except AssertionError:  # stopped by its test: started again on its file
            again = DevServer(server.db, ui=False)
            await self.start(again)
            try:
                await guard.check(again.client, self.config)
            finally:
                await again.stop()
        else:
            await guard.check(client, self.config)

    async def check_all(self) -> None:
        failed = []
        for server, _ in list(self.guards.values()):
            try:
                await self.check(server)
            except AssertionError as exc:
                failed.append(str(exc))
        assert not failed, "\n".join(failed)


@pytest.fixture(scope="session", autouse=True)
async def dev_server_guards(pytestconfig: pytest.Config) -> AsyncIterator[DevServerGuards]:
    guards = DevServerGuards(pytestconfig)

    async def start(server: DevServer) -> None:
        await guards.started(server)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DevServer, "start", start)
        yield guards
    await guards.check_all()


@pytest.fixture(scope="session")
async def temporal_server(
    tmp_path_factory: pytest.TempPathFactory,
    dev_server_guards: DevServerGuards,
    sightings: Sightings,
) -> AsyncIterator[DevServer]:
    """At the end the secrets scenario's check is made again over everything this process
    read, and the histories and UI answers of the jobs since (or of all, where this process did
    not run that scenario: the suite may run in several), and every run on it is replayed
    (`DevServerGuards`)."""
    server = DevServer(tmp_path_factory.mktemp("temporal") / "temporal.db", ui=True)
    await server.start()
    yield server
    try:
        await sightings.sweep(server)
        await dev_server_guards.check(server)
    finally:
        await server.stop()
    assert sightings.leaks() == [], f"the key ({SECRETS[1]}) leaked into these"


@pytest.fixture
async def workers(
    cli_env: Callable[..., dict[str, str]],
    temporal_server: DevServer,
    sightings: Sightings,
    tmp_path: Path,
) -> AsyncIterator[Callable[..., Any]]:
    """`await workers(**env)` starts a worker process on its own task queue (on the session's
    dev server unless `server=` says otherwise). At the end its metrics are scraped and its log
    kept for the secrets check, then it is killed."""
    started: list[Worker] = []

    async def start(
        server: DevServer = temporal_server,
        args: list[str] | None = None,
        module: str | None = None,
        **overrides: Any,
    ) -> Worker:
        """`args`: a `spillway` command instead of `python worker.py` (e.g. an agent); `module`:
        a module of the project run with `python -m` instead."""
        env = worker_env(
            cli_env,
            address=server.address,
            task_queue=f"rel-{uuid.uuid4()}",
            outputs=tmp_path / "outputs",
            **WORKER_DEFAULTS | overrides,
        )
        worker = Worker(env, args, module)
        started.append(worker)
        await worker.start()
        return worker

    yield start
    for worker in started:
        if worker.running and not worker.frozen:
            sightings.add(f"metrics: worker {worker.task_queue}", await worker.metrics())
        await worker.kill()
        sightings.add(f"worker log: {worker.task_queue}", worker.log)


@pytest.fixture
def jobs_on(temporal_server: DevServer, sightings: Sightings) -> Callable[[Worker], Jobs]:
    """Jobs on a worker's task queue of the session's dev server, each noted in `sightings`
    (their histories and UI answers are read at the end)."""

    def make(worker: Worker) -> Jobs:
        return Jobs(temporal_server.client, worker.task_queue, started=sightings.jobs)

    return make


# How the spend ledger's scenarios run their workers: with the worker's workflow cache, and with
# none (SPILLWAY_MAX_CACHED_WORKFLOWS=0), where every workflow task replays the whole history, as
# the first task after a crash or a deploy does: a ledger history that does not replay fails its
# very next task instead of waiting for a restart (0.4.0's failed on its first update).
WORKFLOW_CACHES: dict[str, dict[str, Any]] = {
    "cached": {},
    "uncached": {"SPILLWAY_MAX_CACHED_WORKFLOWS": 0},
}


@pytest.fixture(params=list(WORKFLOW_CACHES))
def ledger_workers(request: pytest.FixtureRequest, workers: Callable[..., Any]) -> Any:
    """`workers` for a spend ledger scenario, which runs twice: `cached` (the default cache)
    and `uncached` (no cache: every workflow task replays its history). What the scenario
    passes wins."""
    cache = WORKFLOW_CACHES[request.param]

    async def start(**overrides: Any) -> Worker:
        worker: Worker = await workers(**cache | overrides)
        return worker

    return start


@pytest.fixture
async def armed(
    workers: Callable[..., Any],
    jobs_on: Callable[[Worker], Jobs],
    comfyui: ComfyUISim,
    minimax: MiniMaxSim,
) -> tuple[Worker, Jobs]:
    """A worker on the ComfyUI and MiniMax doubles with the cloud fallback armed (a job that went
    to the cloud would show at MiniMax), and its jobs; ComfyUI renders in 0.1 s. Three places: the
    scenarios' three jobs at once all find one (a fourth would rightly overflow to the cloud)."""
    comfyui.execution_s = 0.1
    worker: Worker = await workers(
        COMFYUI_URL=comfyui.url,
        MINIMAX_BASE_URL=minimax.url,
        CLOUD_VIDEO_FALLBACK_ENABLED=1,
        A40_MAX_JOBS=3,
    )
    return worker, jobs_on(worker)


@pytest.fixture
def killed_mid_download(
    comfyui: ComfyUISim, tmp_path: Path
) -> Callable[[Worker, Jobs, str], Awaitable[None]]:
    """`await killed_mid_download(downloader, jobs, prompt)`: a job is submitted, the process
    fetching its video (`downloader`, a worker or an agent) is SIGKILLed part-way through, then
    started again; the job must complete on the local route at its first attempt, with its whole
    video fetched again and one POST to ComfyUI. ComfyUI renders BIG_VIDEO_BYTES in 0.1 s."""
    comfyui.execution_s = 0.1
    comfyui.output_bytes = BIG_VIDEO_BYTES

    async def scenario(downloader: Worker, jobs: Jobs, prompt: str) -> None:
        job_id = await jobs.submit(prompt)
        job_dir = tmp_path / "outputs" / job_id
        await kill_mid_download(downloader, job_dir, comfyui.output_bytes)
        await downloader.start()
        plan = await jobs.finished(job_id)
        assert (plan.state, plan.route, plan.local_attempts) == ("completed", "local", 1)
        await assert_whole_video_fetched_again(plan, comfyui, job_dir)
        assert posts_of(comfyui, [job_id]) == {job_id: 1}

    return scenario
