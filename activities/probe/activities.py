"""The fail-open load probe: `a40_load_status` (docs/design.md, "The load probe").

The three sources run concurrently, each under LOAD_PROBE_TIMEOUT_S, so a probe takes as long as
its slowest source, never their sum. Every failure becomes a line in `errors` and a reading of
"not measured": no broken measurement can make the GPU look overloaded and move a job to the
paid cloud. The CLI calls `probe` directly; the workflow goes through the activity.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import httpx
from pydantic import BaseModel
from temporalio import activity

from activities.http import why
from activities.probe.answers import Answer, Guard, Queue, SystemStats, parse
from activities.probe.nvml import GpuReader, GpuReadError, read_apart
from activities.probe.rules import Readings, assess, vram_pct
from activities.probe.shared_read import SharedRead
from spillway.core import names
from spillway.core.models import LoadStatus
from spillway.core.settings import Settings, shown

# How long a good `/queue` answer serves other probes after its request: behind a backlog it is
# the one big read (every waiting prompt's graph), and a count half a second old decides as well
# as a new one. Reachability (`/system_stats`), the guard and every failure are read anew.
QUEUE_REUSE_S = 0.5

# Job ids whose last logged reading is kept (each job probes a few times; the pool for ever).
SAID_KEPT = 256

# Which agent answered a probe (`spillway health` shows it).
AGENT = f"{os.getpid()}@{socket.gethostname()}"


class LoadProbeRequest(BaseModel):
    """Input of `a40_load_status`; the job id only labels the measurement in logs."""

    job_id: str | None = None


class LoadStatusActivities:
    def __init__(self, http: httpx.AsyncClient, settings: Settings, gpu: GpuReader) -> None:
        self._http, self._settings, self._gpu = http, settings, gpu
        self._timeout = settings.LOAD_PROBE_TIMEOUT_S
        self._reads: dict[str, SharedRead[Answer]] = {}
        self._said: dict[str, tuple[object, ...]] = {}  # per job id, the reading logged last

    @activity.defn(name=names.PROBE)
    async def a40_load_status(self, req: LoadProbeRequest) -> LoadStatus:
        started = time.monotonic()
        status = await self.probe()
        activity.metric_meter().create_histogram_float(
            "spillway_load_probe_seconds", "duration of one load probe (all sources)", "s"
        ).record(time.monotonic() - started)
        status.agent = AGENT
        # The GPU pool probes every SPILLWAY_POOL_REPROBE_S while a job waits for headroom: the
        # same reading each time would be a long INFO line every 2 s, so only a change is one.
        said = (status.overloaded, status.reachable, tuple(status.reasons), tuple(status.errors))
        key = req.job_id or "-"
        log = activity.logger.debug if self._said.pop(key, None) == said else activity.logger.info
        self._said[key] = said
        if len(self._said) > SAID_KEPT:
            del self._said[next(iter(self._said))]  # the one probed least recently
        log(
            "load probe for %s: overloaded=%s reachable=%s reasons=%s errors=%s",
            key,
            status.overloaded,
            status.reachable,
            status.reasons,
            status.errors,
        )
        return status

    async def probe(self) -> LoadStatus:
        stats, queue, gpu_util, guard = await asyncio.gather(*(m() for m in self.measurements()))
        errors: list[str] = []
        vram: float | None = None
        if (system := parse(stats, SystemStats, errors)) is not None:
            vram = vram_pct(system.devices[0].vram_total, system.devices[0].vram_free)
        pending = running = None
        if (q := parse(queue, Queue, errors)) is not None:
            pending, running = len(q.queue_pending), len(q.queue_running)
        util, util_error = gpu_util
        guard_busy, guard_job, guard_error = guard
        errors += [e for e in (util_error, guard_error) if e]
        readings = Readings(
            comfyui_answered=stats.answered,
            vram_pct=vram,
            gpu_util_pct=util,
            queue_pending=pending,
            queue_running=running,
            guard_busy=guard_busy,
            guard_job=guard_job,
            errors=errors,
        )
        return assess(readings, self._settings.thresholds, datetime.now(UTC))

    def measurements(self) -> tuple[Callable[[], Awaitable[Any]], ...]:
        """The independent measurements `probe` runs at once (the benchmark also runs them one
        after another, to show what concurrency buys)."""
        return (
            lambda: self._get_json("system_stats", self._settings.comfyui("/system_stats")),
            lambda: self._get_json("queue", self._settings.comfyui("/queue")),
            self._read_gpu_util,
            self._read_guard,
        )

    async def _read_gpu_util(self) -> tuple[float | None, str | None]:
        index = self._settings.A40_NVML_INDEX
        try:
            async with asyncio.timeout(self._timeout):
                # NVML's own thread, not the shared pool: a hung driver holds up nothing else.
                reading = await read_apart(self._gpu, index)
        except TimeoutError:
            return None, f"nvml: no reading within {self._timeout:g}s"
        except GpuReadError as exc:
            return None, f"nvml: {exc}"
        return reading.util_pct, None

    async def _read_guard(self) -> tuple[bool | None, str | None, str | None]:
        url = self._settings.guard_status_url()
        if url is None:
            return None, None, None
        errors: list[str] = []
        guard = parse(await self._get_json("guard", url), Guard, errors)
        if guard is None:
            return None, None, errors[0]
        return guard.busy, None if guard.job is None else str(guard.job), None

    async def _get_json(self, source: str, url: str) -> Answer:
        """`url`'s answer, fetched and parsed once for every probe that asks while it is on
        its way (shared_read.py)."""
        if (shared := self._reads.get(url)) is None:
            shared = self._reads[url] = SharedRead(
                lambda: self._fetch_json(source, url),
                reuse_s=QUEUE_REUSE_S if source == "queue" else 0.0,
                reusable=lambda answer: answer.error is None,
            )
        try:
            # Bounds this probe's wait even if it joined a read another probe started earlier.
            async with asyncio.timeout(self._timeout):
                return await shared()
        except TimeoutError:
            return _no_answer_within(source, url, self._timeout)

    async def _fetch_json(self, source: str, url: str) -> Answer:
        try:
            # httpx's timeout bounds each network step; this bounds the whole exchange, so a
            # server that trickles bytes cannot stretch the probe.
            async with asyncio.timeout(self._timeout):
                response = await self._http.get(url, timeout=self._timeout)
        except (TimeoutError, httpx.TimeoutException):
            return _no_answer_within(source, url, self._timeout)
        except httpx.HTTPError as exc:
            return Answer(
                source, False, error=f"{source}: no answer from {shown(url)} ({why(exc)})"
            )
        if not response.is_success:
            return Answer(
                source, True, error=f"{source}: HTTP {response.status_code} from {shown(url)}"
            )
        try:
            return Answer(source, True, body=response.json())
        except ValueError:
            snippet = response.text[:40].replace("\n", " ")
            return Answer(
                source, True, error=f"{source}: answer from {shown(url)} is not JSON ({snippet!r})"
            )


def _no_answer_within(source: str, url: str, timeout: float) -> Answer:
    return Answer(source, False, error=f"{source}: no answer from {shown(url)} within {timeout:g}s")
