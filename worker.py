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
from activities.nvml import GpuReader, NvmlReader
from spillway.settings import ConfigError, Settings, load_settings
from spillway.temporal import TemporalUnreachable, connect
from spillway.tiers import load_tiers

log = logging.getLogger("spillway.worker")


def activities(
    http: httpx.AsyncClient, settings: Settings, gpu: GpuReader
) -> list[Callable[..., Any]]:
    """Every activity the worker serves, bound to its clients (tests register the same list)."""
    load = LoadStatusActivities(http, settings, gpu)
    return [load.a40_load_status]


async def run_worker(settings: Settings, client: Client) -> None:
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
                activities=activities(http, settings, gpu),
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
        load_tiers(settings.SPILLWAY_ROUTING_TIERS)
        client = await connect()
    except ConfigError as exc:
        print(f"spillway worker: {exc}", file=sys.stderr)
        return 2
    except TemporalUnreachable as exc:
        print(f"spillway worker: {exc}", file=sys.stderr)
        return 1
    await run_worker(settings, client)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
