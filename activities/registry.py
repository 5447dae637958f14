"""Which activities serve which task queue (docs/design.md, "GPU hosts and agents"): the worker's
main queue and its `-waits` queue, and each GPU host agent's queue and `-waits` queue.
`worker.serving` runs a Temporal worker for each."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from temporalio.client import Client

from activities.approvals import ApprovalActivities
from activities.callbacks import CallbackActivities
from activities.cloud import registry as clouds
from activities.comfyui.activities import ComfyUIActivities
from activities.notify import NotifyActivities
from activities.policy import PolicyActivities
from activities.pool import PoolActivities
from activities.probe.activities import LoadStatusActivities
from activities.probe.nvml import GpuReader
from activities.spend.activities import SpendActivities
from activities.spend.ledger import SpendLedger
from activities.spend.vet import LedgerVetting
from activities.storage.store import OutputStore
from spillway.core.hosts import WAITS_SUFFIX, GpuHost, host_settings, ref
from spillway.core.names import pool_queue, vet_queue
from spillway.core.settings import Settings
from spillway.core.tiers import RoutingTiers


@dataclass
class QueueWork:
    """What one Temporal worker (one task queue, one slot pool) serves."""

    task_queue: str
    activities: list[Callable[..., Any]]
    workflows: list[type] = field(default_factory=list)
    max_activities: int | None = None  # None: the SDK's default


def main_work(
    http: httpx.AsyncClient,
    client: Client,
    settings: Settings,
    tiers: RoutingTiers,
    store: OutputStore,
    workflows: list[type],
    pool: type,
) -> list[QueueWork]:
    """The worker's queues: decisions, policy, spend and cloud creates with the workflows; the
    spend ledger's vetting on a queue of its own, only by a worker that holds
    SPILLWAY_LEDGER_SECRET; the long cloud waits in a slot pool of their own; the GPU pool (`pool`)
    on its own queue, with its policy read and holder check."""
    ledger = SpendLedger(
        client, settings.SPILLWAY_TASK_QUEUE, seal_with=settings.SPILLWAY_LEDGER_SECRET
    )
    policy = PolicyActivities(settings, tiers)
    notify = NotifyActivities(http, settings)
    spend = SpendActivities(ledger, settings, tiers)
    callbacks = CallbackActivities(http, settings)
    approvals = ApprovalActivities(settings)
    places = PoolActivities(client)
    decisions: list[Callable[..., Any]] = [
        places.start,
        places.start_by_leave,
        places.quote,
        places.confirm_late,
        policy.read_policy,
        notify.notify_approval_needed,
        approvals.verify,
        spend.reserve,
        spend.settle,
        spend.view,
        spend.recorded,
        callbacks.job_callback,
    ]
    waits: list[Callable[..., Any]] = []
    for provider in clouds.PROVIDERS.values():
        create, free = provider.served(provider.activities(http, settings, ledger, store=store))
        decisions += create
        waits += free
    queue = settings.SPILLWAY_TASK_QUEUE
    works = [
        QueueWork(queue, decisions, workflows),
        QueueWork(queue + WAITS_SUFFIX, waits, max_activities=settings.SPILLWAY_MAX_WAITS),
        QueueWork(
            pool_queue(queue),
            [
                policy.read_policy,
                places.check_holders,
                places.find_holders,
                places.read_places,
            ],
            [pool],
        ),
    ]
    if settings.SPILLWAY_LEDGER_SECRET is not None:
        # Only a holder of the secret can check the ledger's seal and a budget order's
        # signature; a worker without it (no cloud key: it may not start with one) leaves the
        # vet to those that can.
        works.insert(2, QueueWork(vet_queue(queue), [LedgerVetting(client, settings, tiers).vet]))
    return works


@dataclass
class Agent:
    """One GPU host's activities; its ComfyUI watcher (one socket, one poll loop) is closed
    with `aclose` once its Temporal workers have stopped."""

    load: LoadStatusActivities
    comfyui: ComfyUIActivities

    @classmethod
    def of(
        cls,
        http: httpx.AsyncClient,
        settings: Settings,
        host: GpuHost,
        gpu: GpuReader,
        store: OutputStore,
        client: Client,
    ) -> Agent:
        mine = host_settings(settings, host)
        comfyui = ComfyUIActivities(http, mine, store=store, temporal=client)
        return cls(LoadStatusActivities(http, mine, gpu), comfyui)

    def work(self, settings: Settings, host: GpuHost) -> list[QueueWork]:
        comfyui = self.comfyui
        queues = ref(settings.SPILLWAY_TASK_QUEUE, host.name, host.max_jobs)
        short: list[Callable[..., Any]] = [
            self.load.a40_load_status,
            comfyui.upload,
            comfyui.submit,
            comfyui.cancel,
            comfyui.fit,
        ]
        waits: list[Callable[..., Any]] = [comfyui.wait, comfyui.download]
        return [
            QueueWork(queues.task_queue, short),
            QueueWork(queues.waits_queue, waits, max_activities=settings.SPILLWAY_MAX_WAITS),
        ]
