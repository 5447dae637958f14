"""What the reliability scenarios share beyond tests/support: the Temporal dev server as a
process a test can stop and start again, worker processes that can also be frozen and scraped for
metrics, and `Sightings`, every text a person or a tool could read (worker logs, CLI output,
history exports, metrics, UI API answers), which the secrets scenario checks for the key. Jobs
are started and watched with tests/support's `Jobs`, waits are tests/support's `until`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import Iterable
from pathlib import Path

import httpx
from temporalio.api.enums.v1 import EventType, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from spillway.core import names
from spillway.core.ledger import LedgerSummary
from spillway.core.models import LoadStatus, Plan
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from spillway.temporal import DEV_SERVER_ARGS, installed_binary, register_search_attributes
from tests.support.cli import decoded, free_ports, spillway
from tests.support.comfyui import posts_for
from tests.support.constants import CANARY_KEY, CLIP_USD
from tests.support.waiting import until
from tests.support.worker_process import FAST_CLOUD, FAST_WORKER, WorkerProcess
from worker import REPLAYED

# Every worker of this suite holds the canary key: finding it (or its distinctive middle, which
# would betray a truncated or partly masked key) in anything a person can read is a leak.
SECRETS = (CANARY_KEY, "CANARY-7f3a9c2e")
assert SECRETS[1] in CANARY_KEY


class Sightings:
    """Texts a person or a tool could read, by where they were read (`kind: detail`), and the
    jobs started on the shared server (their histories and UI answers are read by `sweep`)."""

    def __init__(self) -> None:
        self.texts: list[tuple[str, str]] = []
        self.jobs: list[str] = []
        self.swept: set[str] = set()

    def add(self, where: str, text: str) -> None:
        self.texts.append((where, text))

    def kinds(self) -> set[str]:
        return {where.split(":", 1)[0] for where, _ in self.texts}

    def leaks(self) -> list[str]:
        return [where for where, text in self.texts if any(s in text for s in SECRETS)]

    async def sweep(self, server: DevServer) -> None:
        """Adds the history and the UI's answers of every job not read yet."""
        limit = asyncio.Semaphore(8)

        async def read(http: httpx.AsyncClient, job_id: str) -> None:
            async with limit:
                self.add(f"history: {job_id}", await history_text(server.client, job_id))
                self.add(f"ui api: {job_id}", await api_texts(http, server.api(), job_id))

        unread = [job_id for job_id in self.jobs if job_id not in self.swept]
        self.swept.update(unread)
        async with httpx.AsyncClient() as http:
            await asyncio.gather(*(read(http, job_id) for job_id in unread))


class DevServer:
    """`temporal server start-dev` on free ports with its state in a SQLite file: stopping and
    starting it again keeps every job, as on an operator's machine. `--http-port` serves the
    HTTP API (/api/v1/...) and, unless headless, `--ui-port` the Web UI and its API."""

    def __init__(self, db: Path, *, ui: bool) -> None:
        self.db, self.ui = db, ui
        self.port, self.http_port, self.ui_port, self.metrics_port = free_ports(4)
        self._proc: asyncio.subprocess.Process | None = None
        self._client: Client | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def client(self) -> Client:
        assert self._client is not None, "the dev server is not running"
        return self._client

    def api(self, ui: bool = True) -> str:
        """Base URL of the default namespace in the UI's API or the server's HTTP API."""
        port = self.ui_port if ui and self.ui else self.http_port
        return f"http://127.0.0.1:{port}/api/v1/namespaces/default"

    async def start(self) -> None:
        args = [
            "server", "start-dev", "--ip", "127.0.0.1", "--port", str(self.port),
            "--http-port", str(self.http_port), "--metrics-port", str(self.metrics_port),
            "--db-filename", str(self.db), "--log-level", "warn", *DEV_SERVER_ARGS,
            *(["--ui-port", str(self.ui_port)] if self.ui else ["--headless"]),
        ]  # fmt: skip
        with self.db.with_suffix(".log").open("ab") as log:
            self._proc = await asyncio.create_subprocess_exec(
                installed_binary("temporal"), *args, stdout=log, stderr=log,
                stdin=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
        for _ in range(300):
            if self._proc.returncode is not None:
                raise AssertionError(f"the dev server exited: {self.db.with_suffix('.log')}")
            try:
                self._client = await Client.connect(
                    self.address, data_converter=pydantic_data_converter
                )
                break
            except RuntimeError:
                await asyncio.sleep(0.1)
        else:
            raise AssertionError("the dev server did not answer within 30 s")
        await register_search_attributes(self.client)

    async def stop(self) -> None:
        """SIGTERM, as systemd or Ctrl-C stops it; the SQLite file keeps everything."""
        proc, self._proc, self._client = self._proc, None, None
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()


class Worker(WorkerProcess):
    """`python worker.py` (see tests/support/worker_process.py) that also serves Prometheus
    metrics on a fresh port each start, and can be frozen (SIGSTOP) to hold whatever it was just
    handed."""

    frozen = False

    def freeze(self) -> None:
        """SIGSTOP: connected but deaf, like a machine that hangs before it dies."""
        self.send_signal(signal.SIGSTOP)
        self.frozen = True

    async def start(self) -> None:
        self.frozen = False
        [port] = free_ports(1)
        self.env["SPILLWAY_METRICS_PORT"] = str(port)
        await super().start()

    async def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.env['SPILLWAY_METRICS_PORT']}/metrics"
        async with httpx.AsyncClient() as http:
            response = await http.get(url, timeout=5)
        response.raise_for_status()
        return response.text


# Settings every worker of this suite runs with: production logic on a test's clock.
WORKER_DEFAULTS = (
    FAST_WORKER
    | FAST_CLOUD
    | {
        "SPILLWAY_SHUTDOWN_GRACE_S": "1",
        "APPROVAL_RECHECK_S": "1",
        "SPILLWAY_POOL_REPROBE_S": "1",
        "COMFYUI_HISTORY_POLL_S": "0.2",
    }
)


async def history_text(client: Client, job_id: str) -> str:
    history = await client.get_workflow_handle(job_id).fetch_history()
    return decoded(json.loads(history.to_json()))


async def api_texts(http: httpx.AsyncClient, base: str, job_id: str) -> str:
    """What the Temporal UI shows of a job, from its API: the execution (memo, search
    attributes, pending activities with their heartbeats and failures) and its history."""
    texts = []
    for path in (f"/workflows/{job_id}", f"/workflows/{job_id}/history"):
        response = await http.get(base + path, timeout=10)
        assert response.status_code == 200, f"{base}{path}: {response.status_code}"
        texts.append(decoded(response.json()))
    return "\n".join(texts)


async def probes(client: Client, job_id: str, at_least: int = 0) -> list[LoadStatus]:
    """The load measurements in a job's history, in order (what the UI's event list shows);
    with `at_least`, once there are that many."""
    return await until(
        lambda: _probes(client, job_id),
        lambda found: len(found) >= at_least,
        what=f"{at_least} load probes in the history of job {job_id}",
    )


async def _probes(client: Client, job_id: str) -> list[LoadStatus]:
    history = await client.get_workflow_handle(job_id).fetch_history()
    probe_events = {
        e.event_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == names.PROBE
    }
    found = []
    for e in history.events:
        attributes = e.activity_task_completed_event_attributes
        if (
            e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
            and attributes.scheduled_event_id in probe_events
        ):
            [load] = await client.data_converter.decode(attributes.result.payloads, [LoadStatus])
            found.append(load)
    return found


async def polling(client: Client, task_queue: str) -> None:
    """Until the server sees a workflow poller on the task queue (a long poll is then open)."""
    request = DescribeTaskQueueRequest(
        namespace=client.namespace,
        task_queue=TaskQueue(name=task_queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
    )
    await until(
        lambda: client.workflow_service.describe_task_queue(request),
        lambda r: r.pollers,
        what=f"a workflow poller on {task_queue}",
    )


async def cli(sightings: Sightings, *args: str, env: dict[str, str]) -> tuple[int, str, str]:
    """The `spillway` console script; what it printed is kept for the secrets check."""
    code, out, err = await spillway(*args, env=env)
    sightings.add(f"cli: spillway {' '.join(args)}", out + err)
    return code, out, err


async def assert_replay(client: Client, task_queue: str) -> None:
    """Every run of a worker's queues (its jobs, their ledger and GPU pool) replays against
    today's workflow code from its history as the server has it: a run whose live activations
    differ from its replayed ones (a nondeterminism error) would stall at the next worker that
    does not hold it in its cache, as after a crash or a deploy."""
    queues = " OR ".join(f"TaskQueue = '{q}'" for q in (task_queue, names.pool_queue(task_queue)))
    histories = client.list_workflows(queues).map_histories()
    replayer = Replayer(workflows=REPLAYED, data_converter=pydantic_data_converter)
    failures = []
    async with replayer.workflow_replay_iterator(histories) as results:
        async for result in results:
            if result.replay_failure is not None:
                failures.append(f"{result.history.workflow_id}: {result.replay_failure}")
    assert not failures, "runs that do not replay:\n" + "\n".join(failures)


def posts_of(comfyui: ComfyUISim, job_ids: Iterable[str]) -> dict[str, int]:
    """POST /prompt that reached ComfyUI for each job's first attempt."""
    return {job: posts_for(comfyui, job) for job in job_ids}


CHARGE_MAY_EXIST = "a charge may exist"  # workflows/texts.py, every ambiguous create's words


def assert_spend_covers(
    summary: LedgerSummary, cloud: MiniMaxSim, plans: Iterable[Plan], clip_usd: float = CLIP_USD
) -> None:
    """Money invariant 5 as people read it (docs/design.md): the ledger's spent plus reserved
    covers every task the provider double made, and a job that ended saying a charge may exist
    is counted as spent (its latest entry `maybe_charged` or `charged`; a settled one may have
    left the entries at a continue-as-new, folded into the totals)."""
    day = summary.day
    entries = "\n".join(e.model_dump_json() for e in summary.entries)
    made = cloud.tasks_created * clip_usd
    assert day.spent_usd + day.reserved_usd >= made - 1e-6, (
        f"the ledger counts {day.spent_usd} spent + {day.reserved_usd} reserved for "
        f"{cloud.tasks_created} tasks made ({made:.2f}):\n{entries}"
    )
    latest = {e.job_id: e for e in summary.entries}
    for plan in plans:
        entry = latest.get(plan.job_id)
        if CHARGE_MAY_EXIST in (plan.error or "") and entry is not None:
            assert entry.state in ("maybe_charged", "charged"), (
                f"job {plan.job_id} says a charge may exist; the ledger holds "
                f"{entry.model_dump_json()}"
            )


def creates_of(minimax: MiniMaxSim, prompts: dict[str, str]) -> dict[str, int]:
    """MiniMax create requests received for each job (by its unique cloud prompt)."""
    return {job: minimax.create_calls_by_prompt[prompt] for job, prompt in prompts.items()}


# A video streamed for long enough that a process can be killed with it part-way home.
BIG_VIDEO_BYTES = 200 * 1024**2


def partial_files(job_dir: Path) -> list[Path]:
    """The job's downloads still under way (`.NAME.part` files)."""
    return list(job_dir.glob("**/.*.part"))


def partial_bytes(job_dir: Path) -> int:
    total = 0
    for part in partial_files(job_dir):
        with contextlib.suppress(FileNotFoundError):  # renamed into place meanwhile
            total += part.stat().st_size
    return total


async def kill_mid_download(process: WorkerProcess, job_dir: Path, video_bytes: int) -> None:
    """Kill the process downloading the job's video once 16 MiB of it are on disk, and check it
    died with the video part-way home."""
    await until(lambda: partial_bytes(job_dir) >= 16 * 1024**2, timeout_s=30)
    await process.kill()
    assert 0 < partial_bytes(job_dir) < video_bytes


async def assert_whole_video_fetched_again(plan: Plan, comfyui: ComfyUISim, job_dir: Path) -> None:
    """The job's one video is whole (ComfyUI's size and sha256), fetched twice (the killed
    download and the one after), no partial file left; then deleted (200 MB: not kept by pytest)."""
    [video] = plan.outputs
    assert video.bytes == comfyui.output_bytes
    assert video.sha256 == comfyui.expected_sha256(Path(video.path).name, "video")
    assert not partial_files(job_dir)  # the dead process's partial file is gone
    assert comfyui.hits["GET /view"] == 2
    await asyncio.to_thread(Path(video.path).unlink)
