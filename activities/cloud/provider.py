"""The shape of a cloud provider, and what every provider's activities share.

A provider is a folder of its own (activities/minimax/, activities/kling/: its client, its
answer parsing, its activities, its error types) that exports one `CloudProvider`: its name,
what people are told about it, its activity class, and the failure types the workflow acts on.
The workflow, the spend ledger and the worker ask this shape and never compare a provider's
name (activities/cloud/registry.py lists the providers).

Around their one paid request the providers' activities share the base class (settings, timing,
the output store and the guard every create runs inside), the jittered backoff between provable
"not now"s, the first frame as a provider takes it, how the guard's outcome becomes the
activity's result or its ambiguous failure's details, and the download helpers.
"""

from __future__ import annotations

import contextlib
import random
import secrets
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import httpx
from temporalio.exceptions import ApplicationError

from activities.cloud.models import (
    CloudCreate,
    CloudCreated,
    CloudDone,
    CloudDownload,
    CloudPoll,
    CreateVerdict,
    LostCreate,
    Reconciled,
)
from activities.heartbeat import Heartbeat
from activities.http import why
from activities.inputs import data_url, read_input
from activities.spend.guard import Beginning, CreatedOnce, CreateGuard
from activities.spend.ledger import Ledger
from activities.storage.opening import OwnsOutputStore
from activities.storage.store import IncompleteDownload, OutputStore
from activities.storage.store import Progress as StoreProgress
from spillway.core.models import CloudRequest, Downloaded, JobInput, Progress
from spillway.core.settings import Settings
from spillway.core.spend_book import token_of


class Timing(Protocol):
    @property
    def heartbeat_every_s(self) -> float: ...


TimingT = TypeVar("TimingT", bound=Timing)


class CloudActivities(OwnsOutputStore, Generic[TimingT]):
    """A provider's activity class: `timing` None takes the provider's defaults with a beat six
    times per heartbeat timeout; `store` None opens a store of its own (OwnsOutputStore). Each
    provider defines the four activities below under names of its own (`@activity.defn`)."""

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

    async def create(self, req: CloudCreate) -> CloudCreated:
        """The one paid request, inside the guard; never retried by Temporal."""
        raise NotImplementedError

    async def poll(self, req: CloudPoll) -> CloudDone:
        """Free: until the task has its video."""
        raise NotImplementedError

    async def download(self, req: CloudDownload) -> Downloaded:
        """Free: the video into the output store; a re-run keeps a finished one."""
        raise NotImplementedError

    async def reconcile(self, req: LostCreate) -> Reconciled:
        """Free, for providers that can say whether a create whose worker was lost made a
        task (`CloudProvider.reconciles`)."""
        raise NotImplementedError

    async def _create_once(
        self, req: CloudCreate, send: Callable[[Heartbeat], Awaitable[CreateVerdict]]
    ) -> CreatedOnce:
        """`send(heartbeat)`, once, inside the guard (the right world, armed, the ledger's
        begin, the outcome settled)."""
        # Beats through the ledger's begin and settle too: a slow ledger is not a dead worker.
        # The first beat, sent at once, shows the ledger the token this attempt begins with.
        nonce = secrets.token_hex(32)
        first = Beginning(phase="reserving", token=token_of(nonce))
        async with Heartbeat(self._timing.heartbeat_every_s, first) as hb:
            return await self._guard.create(
                req.job_id, req.authorisation, req.simulated, lambda: send(hb), nonce
            )


@dataclass(frozen=True)
class CloudProvider:
    name: str  # in CLOUD_PROVIDERS, routing_tiers.json's `provider` and the ledger's entries
    create_activity: str  # the name of its create activity: the ledger vets who runs it
    poll_activity: str  # a run that polls has a task: the ledger reads earlier runs for it
    label: str  # how messages name it
    console: str  # where a person checks for a task and its charge
    key_names: tuple[str, ...]  # the worker's settings that hold its keys, all needed
    base_url_setting: str  # the worker's setting that holds its API's address
    activities: type[CloudActivities[Any]]
    # The key of its planning figure in routing_tiers.json's `estimated_cost_usd`.
    cost_key: Callable[[CloudRequest, Settings], str]
    # The longest its create activity can run: what a worker's shutdown grace must exceed.
    longest_create_s: Callable[[Settings], float]
    # Create failures that prove nothing was made: the next provider may take the job.
    refused: frozenset[str]
    no_key: str  # the failure of an activity run on a worker without its keys
    poll_final: tuple[str, ...]  # poll and download failures that no retry can mend
    download_final: tuple[str, ...]
    # Whether it can say, after a create whose worker was lost, if that create made a task.
    reconciles: bool = False

    def keys_present(self, settings: Settings) -> bool:
        return all(getattr(settings, key) is not None for key in self.key_names)

    def base_url(self, settings: Settings) -> str:
        return str(getattr(settings, self.base_url_setting))

    def served(self, activities: CloudActivities[Any]) -> tuple[list[Any], list[Any]]:
        """Its activities as the worker serves them: (the create, the long free ones)."""
        waits = [activities.poll, activities.download]
        if self.reconciles:
            waits.append(activities.reconcile)
        return [activities.create], waits


class Backoff:
    def __init__(self, delays: tuple[float, ...]) -> None:
        self._delays, self._n = delays, 0

    def next(self) -> float:
        delay = self._delays[min(self._n, len(self._delays) - 1)]
        self._n += 1
        return delay * random.uniform(0.8, 1.2)  # noqa: S311 - jitter, not security


async def first_frame(
    store: OutputStore,
    http: httpx.AsyncClient,
    frame: JobInput,
    max_bytes: int,
    allow: frozenset[str],
) -> str:
    """A data URL of the stored image, or the client's URL as it is. A data URL rather than a
    presigned one: the provider validates it with the create itself (a refusal before any task),
    it needs no bucket the provider can reach (a MinIO on an internal network is fine) and no
    URL that may expire while the task waits in line."""
    if frame.uri.startswith(("http://", "https://")) and frame.sha256 is None:
        return frame.uri
    return data_url(await read_input(store, http, frame, max_bytes, allow=allow))


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


def progress_beats(hb: Heartbeat) -> StoreProgress:
    """The store's `progress(done, total)` as the heartbeat's details, for the UI."""

    def progress(done: int, total: int | None) -> None:
        percent = round(100 * done / total, 1) if total else None
        hb.update(Progress(phase="downloading", value=done, max=total, percent=percent))

    return progress


@contextlib.contextmanager
def download_failures(
    error_type: str, cut_short: str, failed: str, clean: Callable[[str], str]
) -> Iterator[None]:
    """A body that ended early ("`cut_short`: ...") or a transfer that broke ("`failed` failed
    (...)", the reason scrubbed by `clean`) as a retried ApplicationError of `error_type`: the
    video is paid for, and the next attempt fetches it again."""
    try:
        yield
    except IncompleteDownload as exc:
        raise ApplicationError(f"{cut_short}: {exc}", type=error_type) from None
    except httpx.HTTPError as exc:
        raise ApplicationError(f"{failed} failed ({clean(why(exc))})", type=error_type) from None
