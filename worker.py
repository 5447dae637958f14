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
from typing import Any

import httpx
from temporalio.client import Client
from temporalio.worker import Worker

from activities.load_status import LoadStatusActivities
from activities.minimax import MiniMaxActivities
from activities.notify import NotifyActivities
from activities.nvml import GpuReader, NvmlReader
from activities.policy import PolicyActivities
from spillway.errors import ConfigError
from spillway.settings import Settings, load_settings
from spillway.temporal import TemporalUnreachable, connect
from spillway.tiers import RoutingTiers, load_tiers
from workflows.video_job import VideoJobWorkflow

log = logging.getLogger("spillway.worker")

WORKFLOWS = [VideoJobWorkflow]


def activities(
    http: httpx.AsyncClient, settings: Settings, tiers: RoutingTiers, gpu: GpuReader
) -> list[Callable[..., Any]]:
    """Every activity the worker serves, bound to its clients (tests register the same list)."""
    load = LoadStatusActivities(http, settings, gpu)
    policy = PolicyActivities(settings, tiers)
    notify = NotifyActivities(http, settings)
    minimax = MiniMaxActivities(http, settings)
    return [
        load.a40_load_status,
        policy.read_policy,
        notify.notify_approval_needed,
        minimax.create,
        minimax.poll,
        minimax.download,
    ]


async def run_worker(settings: Settings, tiers: RoutingTiers, client: Client) -> None:
    gpu = NvmlReader()
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
                activities=activities(http, settings, tiers, gpu),
            )
            async with worker:
                log.info("worker polling task queue %r", settings.SPILLWAY_TASK_QUEUE)
                await stop.wait()
                log.info("shutting down")
    finally:
        gpu.close()


async def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = load_settings()
        tiers = load_tiers(settings.SPILLWAY_ROUTING_TIERS)
        client = await connect()
    except ConfigError as exc:
        print(f"spillway worker: {exc}", file=sys.stderr)
        return 2
    except TemporalUnreachable as exc:
        print(f"spillway worker: {exc}", file=sys.stderr)
        return 1
    await run_worker(settings, tiers, client)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
