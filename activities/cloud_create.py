"""What every cloud provider's activities (activities/minimax.py, activities/kling.py) share
around their one paid request: the base class that holds the settings, the timing, the output
store and the guard every create runs inside, the jittered backoff between provable "not now"s,
the first frame as the provider takes it, and how the guard's outcome becomes the activity's
result or its ambiguous failure's details."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

import httpx

from activities.heartbeat import Heartbeat
from activities.inputs import data_url, read_input
from activities.ledger_client import Ledger
from activities.spend import CreatedOnce, CreateGuard
from activities.storage import OutputStore
from activities.store_owner import OwnsOutputStore
from spillway.cloud_models import CloudCreate, CloudCreated, CreateVerdict
from spillway.models import JobInput, Progress
from spillway.settings import Settings


class Timing(Protocol):
    @property
    def heartbeat_every_s(self) -> float: ...


TimingT = TypeVar("TimingT", bound=Timing)


class CloudActivities(OwnsOutputStore, Generic[TimingT]):
    """A provider's activity class: `timing` None takes the provider's defaults with a beat six
    times per heartbeat timeout; `store` None opens a store of its own (OwnsOutputStore)."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        settings: Settings,
        ledger: Ledger,
        timing: TimingT | None = None,
        store: OutputStore | None = None,
    ) -> None:
        self._http, self._settings = http, settings
        every = settings.SPILLWAY_HEARTBEAT_TIMEOUT_S / 6
        self._timing = timing or self._default_timing(every)
        self._guard = CreateGuard(ledger, settings)
        self._use_store(settings, store)

    def _default_timing(self, heartbeat_every_s: float) -> TimingT:
        raise NotImplementedError

    async def _create_once(
        self, req: CloudCreate, send: Callable[[Heartbeat], Awaitable[CreateVerdict]]
    ) -> CreatedOnce:
        """`send(heartbeat)`, once, inside the guard (the right world, armed, the ledger's
        begin, the outcome settled)."""
        # Beats through the ledger's begin and settle too: a slow ledger is not a dead worker.
        async with Heartbeat(self._timing.heartbeat_every_s, Progress(phase="reserving")) as hb:
            return await self._guard.create(
                req.job_id, req.authorisation, req.simulated, lambda: send(hb)
            )


class Backoff:
    def __init__(self, delays: tuple[float, ...]) -> None:
        self._delays, self._n = delays, 0

    def next(self) -> float:
        delay = self._delays[min(self._n, len(self._delays) - 1)]
        self._n += 1
        return delay * random.uniform(0.8, 1.2)  # noqa: S311 - jitter, not security


async def first_frame(
    store: OutputStore, http: httpx.AsyncClient, frame: JobInput, max_bytes: int
) -> str:
    """A data URL of the stored image, or the client's URL as it is. A data URL rather than a
    presigned one: the provider validates it with the create itself (a refusal before any task),
    it needs no bucket the provider can reach (a MinIO on an internal network is fine) and no
    URL that may expire while the task waits in line."""
    if frame.uri.startswith(("http://", "https://")) and frame.sha256 is None:
        return frame.uri
    return data_url(await read_input(store, http, frame, max_bytes))


def created(done: CreatedOnce) -> CloudCreated | None:
    """The activity's result when the provider made its task; None for any other verdict."""
    verdict = done.verdict
    if verdict.outcome != "created" or not verdict.task_id:
        return None
    return CloudCreated(
        task_id=verdict.task_id,
        created_at=verdict.sent_at,
        create_calls=verdict.attempts,
        settled=done.settled,
    )


def sent_when(verdict: CreateVerdict) -> str:
    sent = verdict.sent_at
    return sent.strftime("%Y-%m-%d %H:%M:%S UTC") if sent else "the time of the create"


def ambiguous_details(job_id: str, verdict: CreateVerdict, **ids: str) -> dict[str, object]:
    """An ambiguous create's failure details: what a person needs to find the task, if any."""
    sent = verdict.sent_at
    return {
        "job_id": job_id,
        **ids,
        "attempted_at": sent.isoformat() if sent else None,
        "reason": verdict.message,
        "task_id": verdict.task_id,
    }
