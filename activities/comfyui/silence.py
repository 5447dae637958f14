"""The host-lost rule for the LOCAL route's calls that are not waits: submit, upload, download
(docs/design.md, "GPU hosts and agents").

Temporal retries them while ComfyUI does not answer, and a host that is partitioned (connections
hang, nothing is refused) would keep them retrying forever, the job `running_local` with no
cloud fallback and no give-up. So each attempt that fails for want of an answer hands on, in its
heartbeat details, since when the host has been silent; once that silence reaches the call's
`report_silence_after_s`, the call fails with HOST_SILENT and the workflow decides as it does for
a wait (the host lost: armed, the cloud; long enough, give up), or calls again.

The silence begins when the first request that got no answer left (a 5xx or a cut stream: when
it came back), and any answer this agent's client gets from ComfyUI after that ends it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.comfyui.client import ComfyUIClient, Unavailable
from activities.comfyui.models import HOST_SILENT, HostBound, Silence
from activities.heartbeat import Heartbeat
from spillway.core.models import Progress


class Retried(Progress):
    """An attempt's heartbeat details, with what the next attempt must know: since when the
    host has not answered (None: it answered)."""

    silent_since: datetime | None = None


@contextlib.contextmanager
def bounded_by_silence(
    client: ComfyUIClient, heartbeat: Heartbeat, req: HostBound
) -> Iterator[None]:
    """Around one attempt's ComfyUI requests: turns an Unavailable into HOST_SILENT once the
    silence is long enough, and otherwise notes it for the next attempt."""
    told = [t.timestamp() for t in (req.silent_since, _carried(activity.info())) if t]
    try:
        yield
    except Unavailable as exc:
        if req.report_silence_after_s is None:
            raise
        since = min(told) if told and client.answered_at < min(told) else None
        if since is None:
            since = exc.sent_at if exc.sent_at is not None else time.time()
        silent_since = datetime.fromtimestamp(since, UTC)
        if time.time() - since >= req.report_silence_after_s:
            shown = heartbeat.details
            silence = Silence(
                silent_since=silent_since, posted_at=getattr(shown, "posted_at", None)
            )
            raise ApplicationError(
                f"{exc}; no answer since {silent_since:%H:%M:%S} UTC",
                silence.model_dump(mode="json"),
                type=HOST_SILENT,
                non_retryable=True,
            ) from exc.__cause__
        heartbeat.update(_noted(heartbeat.details, silent_since), now=True)
        raise


def _noted(shown: Progress | None, silent_since: datetime) -> Retried:
    if isinstance(shown, Retried):
        return shown.model_copy(update={"silent_since": silent_since})
    phase = {"phase": "ComfyUI not answering"} if shown is None else shown.model_dump()
    return Retried(**phase, silent_since=silent_since)


def _carried(info: activity.Info) -> datetime | None:
    details: Sequence[Any] = info.heartbeat_details
    try:
        return Retried.model_validate(details[0]).silent_since if details else None
    except ValidationError:
        return None
