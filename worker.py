"""The spillway worker: `python worker.py` (or `spillway worker`, later).

Connects through temporalio.envconfig like every spillway command, validates the configuration
before polling, and serves the task queue SPILLWAY_TASK_QUEUE. Several workers may share it.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import httpx
from temporalio.client import Client
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.worker import Worker

from activities.comfyui import ComfyUIActivities
from activities.ledger_client import Ledger, SpendLedger
from activities.load_status import LoadStatusActivities
from activities.minimax import MiniMaxActivities
from activities.minimax_client import MiniMaxTiming
from activities.notify import NotifyActivities
from activities.nvml import GpuReader, NvmlReader
from activities.policy import PolicyActivities
from activities.spend import SpendActivities, budgets_of
from spillway import search_attributes as sa
from spillway.errors import ConfigError
from spillway.settings import Settings, load_settings
from spillway.temporal import TemporalUnreachable, connect
from spillway.tiers import RoutingTiers, load_tiers
from workflows.spend_ledger import SpendLedgerWorkflow
from workflows.video_job import VideoJobWorkflow

log = logging.getLogger("spillway.worker")

WORKFLOWS = [VideoJobWorkflow, SpendLedgerWorkflow]


def activities(
    http: httpx.AsyncClient,
    settings: Settings,
    tiers: RoutingTiers,
    gpu: GpuReader,
    ledger: Ledger,
) -> list[Callable[..., Any]]:
    """Every activity the worker serves, bound to its clients (tests register the same list)."""
    load = LoadStatusActivities(http, settings, gpu)
    policy = PolicyActivities(settings, tiers)
    notify = NotifyActivities(http, settings)
    comfyui = ComfyUIActivities(http, settings)
    minimax = MiniMaxActivities(http, settings, ledger)
    spend = SpendActivities(ledger, settings, tiers)
    return [
        load.a40_load_status,
        policy.read_policy,
        notify.notify_approval_needed,
        comfyui.submit,
        comfyui.wait,
        comfyui.download,
        comfyui.cancel,
        minimax.create,
        minimax.poll,
        minimax.download,
        spend.reserve,
        spend.settle,
        spend.view,
    ]


async def run_worker(settings: Settings, tiers: RoutingTiers, client: Client) -> None:
    gpu = NvmlReader()
    ledger = SpendLedger(client, settings.SPILLWAY_TASK_QUEUE)
    longest = MiniMaxTiming().longest_create_s(settings.MINIMAX_CREATE_TIMEOUT_S)
    if longest > settings.SPILLWAY_SHUTDOWN_GRACE_S:
        log.warning(
            "SPILLWAY_SHUTDOWN_GRACE_S=%g is shorter than the longest MiniMax create (%gs): a "
            "create still running when it ends is cut off and its job fails as ambiguous",
            settings.SPILLWAY_SHUTDOWN_GRACE_S,
            longest,
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with httpx.AsyncClient() as http:
            worker = Worker(
                client,
                task_queue=settings.SPILLWAY_TASK_QUEUE,
                workflows=WORKFLOWS,
                activities=activities(http, settings, tiers, gpu, ledger),
                # On SIGTERM running activities get this long to finish; after that they are
                # cancelled and, heartbeats stopping, resume on another worker.
                graceful_shutdown_timeout=timedelta(seconds=settings.SPILLWAY_SHUTDOWN_GRACE_S),
            )
            gauge = asyncio.create_task(_count_waiting_jobs(client))
            async with worker:
                log.info("worker polling task queue %r", settings.SPILLWAY_TASK_QUEUE)
                await _announce_budgets(ledger, settings)
                await stop.wait()
                log.info(
                    "shutting down: running activities get %gs to finish",
                    settings.SPILLWAY_SHUTDOWN_GRACE_S,
                )
            gauge.cancel()
    finally:
        gpu.close()


async def _count_waiting_jobs(client: Client) -> None:
    """The `spillway_jobs_awaiting_approval` gauge, from Temporal's visibility every 30 s."""
    runtime = client.service_client.config.runtime or Runtime.default()
    gauge = runtime.metric_meter.create_gauge(
        "spillway_jobs_awaiting_approval", "jobs waiting for a person's decision"
    )
    query = f"WorkflowType = 'VideoJobWorkflow' AND {sa.STATE.name} = 'awaiting_approval'"
    while True:
        try:
            gauge.set((await client.count_workflows(query)).count)
        except Exception as exc:  # a visibility hiccup must not stop the worker
            log.warning("counting waiting jobs failed: %s", exc)
        await asyncio.sleep(30)


async def _announce_budgets(ledger: SpendLedger, settings: Settings) -> None:
    """The ledger learns the budgets in force (for `spillway budget`); a reservation carries
    them too, so a failure here only delays what `budget` shows."""
    try:
        await ledger.configure(budgets_of(settings))
    except Exception as exc:
        log.warning("spend ledger: announcing the budgets failed: %s", exc)


def _runtime(settings: Settings) -> Runtime | None:
    if settings.SPILLWAY_METRICS_PORT is None:
        return None
    address = f"0.0.0.0:{settings.SPILLWAY_METRICS_PORT}"
    return Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=address)))


async def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise
    try:
        settings = load_settings()
        tiers = load_tiers(settings.SPILLWAY_ROUTING_TIERS)
        client = await connect(_runtime(settings))
    except ConfigError as exc:
        print(f"spillway worker: {exc}", file=sys.stderr)
        return 2
    except TemporalUnreachable as exc:
        print(f"spillway worker: {exc}", file=sys.stderr)
        return 1
    if settings.SPILLWAY_METRICS_PORT is not None:
        log.info("Prometheus metrics on :%d/metrics", settings.SPILLWAY_METRICS_PORT)
    await run_worker(settings, tiers, client)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
