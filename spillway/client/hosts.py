"""Draining and resuming a GPU host (`spillway host drain|resume`, docs/design.md, "GPU
admission"): a signal to the GPU pool, which applies it in order with the jobs' asks and keeps
it in its state (through continue-as-new and a new pool), then the pool's view read until it
shows it. A pool that is not running is started with it, as a job's first ask starts one."""

from __future__ import annotations

import asyncio
import time

from temporalio.client import Client

from spillway.client.queue import pool_view
from spillway.core import names
from spillway.core.errors import ConfigError, Failed
from spillway.core.gpu_pool import HostPlaces, PoolDrain, PoolInput, PoolView

APPLIED_WITHIN_S = 15.0  # the pool applies a message within a workflow task; a worker must run
LOOK_EVERY_S = 0.2


async def set_drain(client: Client, task_queue: str, drain: PoolDrain) -> HostPlaces:
    """The host as the pool has it once it applied `drain`. ConfigError for a host the workers
    do not have; Failed when the pool did not apply it in time (no worker serves it)."""
    _known(await pool_view(client, task_queue), drain.host)
    await client.start_workflow(
        names.GPU_POOL,
        PoolInput(),
        id=names.pool_id(task_queue),
        task_queue=names.pool_queue(task_queue),
        start_signal=names.POOL_DRAIN,
        start_signal_args=[drain],
    )
    deadline = time.monotonic() + APPLIED_WITHIN_S
    while True:
        view = await pool_view(client, task_queue)
        host = _known(view, drain.host)
        if host is not None and _applied(host, drain):
            return host
        if time.monotonic() > deadline:
            raise Failed(
                f"the GPU pool did not show host {drain.host!r} "
                f"{'drained' if drain.drain else 'resumed'} within {APPLIED_WITHIN_S:g} s: is a "
                "worker running? (the signal stays with the pool and is applied when one is)"
            )
        await asyncio.sleep(LOOK_EVERY_S)


def _known(view: PoolView, name: str) -> HostPlaces | None:
    """The host in a running pool's view; None while the pool has not read its hosts yet."""
    if view.pool != "running" or not any(h.max_jobs for h in view.hosts):
        return None
    for host in view.hosts:
        if host.name == name and host.max_jobs > 0:  # 0: no longer the workers' (still held)
            return host
    have = ", ".join(h.name for h in view.hosts if h.max_jobs > 0)
    raise ConfigError(f"no GPU host {name!r}: the workers have {have}")


def _applied(host: HostPlaces, drain: PoolDrain) -> bool:
    if not drain.drain:
        return host.drained is None
    return host.drained is not None and (host.drained.by, host.drained.reason) == (
        drain.by,
        drain.reason,
    )
