"""What every cloud provider's create activity (activities/minimax.py, activities/kling.py)
shares around its one paid request: the jittered backoff between provable "not now"s, the first
frame as the provider takes it, and how the guard's outcome becomes the activity's result or its
ambiguous failure's details."""

from __future__ import annotations

import random

import httpx

from activities.inputs import data_url, read_input
from activities.spend import CreatedOnce
from activities.storage import OutputStore
from spillway.cloud_models import CloudCreated, CreateVerdict
from spillway.models import JobInput


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
