"""Which activities serve which task queue (docs/design.md, "GPU hosts and agents"): the worker's
main queue and its `-waits` queue, and each GPU host agent's queue and `-waits` queue.
`worker.serving` runs a Temporal worker for each."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from activities.callbacks import CallbackActivities
from activities.comfyui import ComfyUIActivities
from activities.kling import KlingActivities
from activities.ledger_client import Ledger
from activities.load_status import LoadStatusActivities
from activities.minimax import MiniMaxActivities
from activities.notify import NotifyActivities
from activities.nvml import GpuReader
from activities.policy import PolicyActivities
from activities.spend import SpendActivities
from activities.storage import OutputStore
from spillway.hosts import WAITS_SUFFIX, GpuHost, host_settings, ref
from spillway.settings import Settings
from spillway.tiers import RoutingTiers


@dataclass
class QueueWork:
    """What one Temporal worker (one task queue, one slot pool) serves."""

    task_queue: str
    activities: list[Callable[..., Any]]
    workflows: list[type] = field(default_factory=list)
    max_activities: int | None = None  # None: the SDK's default


def main_work(
    http: httpx.AsyncClient,
    settings: Settings,
    tiers: RoutingTiers,
    ledger: Ledger,
    store: OutputStore,
    workflows: list[type],
) -> list[QueueWork]:
    """The worker's two queues: decisions, policy, spend and cloud creates with the workflows;
    the long cloud waits in a slot pool of their own."""
    policy = PolicyActivities(settings, tiers)
    notify = NotifyActivities(http, settings)
    minimax = MiniMaxActivities(http, settings, ledger, store=store)
    kling = KlingActivities(http, settings, ledger, store=store)
    spend = SpendActivities(ledger, settings, tiers)
    callbacks = CallbackActivities(http, settings)
    queue = settings.SPILLWAY_TASK_QUEUE
    decisions: list[Callable[..., Any]] = [
        policy.read_policy,
        notify.notify_approval_needed,
        spend.reserve,
        spend.settle,
        spend.view,
        spend.recorded,
        minimax.create,
        kling.create,
        callbacks.job_callback,
    ]
    waits: list[Callable[..., Any]] = [
        minimax.poll,
        minimax.download,
        kling.poll,
        kling.download,
        kling.reconcile,
    ]
    return [
        # Polls scheduled before the waits queue existed still run here.
        QueueWork(queue, [*decisions, *waits], workflows),
        QueueWork(queue + WAITS_SUFFIX, waits, max_activities=settings.SPILLWAY_MAX_WAITS),
    ]


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
    ) -> Agent:
        mine = host_settings(settings, host)
        return cls(
            LoadStatusActivities(http, mine, gpu), ComfyUIActivities(http, mine, store=store)
        )

    @property
    def short(self) -> list[Callable[..., Any]]:
        comfyui = self.comfyui
        return [self.load.a40_load_status, comfyui.upload, comfyui.submit, comfyui.cancel]

    @property
    def waits(self) -> list[Callable[..., Any]]:
        return [self.comfyui.wait, self.comfyui.download]

    def work(self, settings: Settings, host: GpuHost) -> list[QueueWork]:
        queues = ref(settings.SPILLWAY_TASK_QUEUE, host.name)
        return [
            QueueWork(queues.task_queue, self.short),
            QueueWork(queues.waits_queue, self.waits, max_activities=settings.SPILLWAY_MAX_WAITS),
        ]
