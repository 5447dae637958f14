"""What the MiniMax and Kling downloads (activities/minimax_download.py,
activities/kling_download.py) share while a finished video streams into the output store: its
progress as heartbeats, and a broken transfer as a download failure Temporal retries."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import httpx
from temporalio.exceptions import ApplicationError

from activities import files
from activities.heartbeat import Heartbeat
from activities.http_errors import why
from activities.storage import Progress as StoreProgress
from spillway.models import Progress


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
    except files.IncompleteDownload as exc:
        raise ApplicationError(f"{cut_short}: {exc}", type=error_type) from None
    except httpx.HTTPError as exc:
        raise ApplicationError(f"{failed} failed ({clean(why(exc))})", type=error_type) from None
