"""The failure types of Kling's activities, which the provider's shape (`PROVIDER` in
activities.py) hands to the workflow's retry policies and failure handling, and how a client
error of a free call becomes one of them."""

from __future__ import annotations

from collections.abc import Mapping

from temporalio.exceptions import ApplicationError

from activities.kling.client import KlingError

REFUSED = "KlingRefused"  # Kling provably made nothing and will not for this account or request
CREATE_GAVE_UP = "KlingCreateGaveUp"  # every try was a provable "not now" until the budget ended
AMBIGUOUS_CREATE = "KlingAmbiguousCreate"  # a task, and a charge, may exist
NO_KEY = "KlingNoKey"
TASK_FAILED = "KlingTaskFailed"
TASK_UNKNOWN = "KlingTaskUnknown"  # Kling reports no such task under either kind
UNAVAILABLE = "KlingUnavailable"  # a free call got no usable answer: retried
DOWNLOAD_FAILED = "KlingDownloadFailed"  # retried
VIDEO_GONE = "KlingVideoGone"  # the video URL answers 404/410: Kling deleted it (30 days)


def kling_failure(
    exc: KlingError, retried_as: str, final_as: str, explained: str, details: Mapping[str, object]
) -> ApplicationError:
    """A KlingError as a free activity's failure: retried as `retried_as` while asking Kling
    again may help, else final as `final_as`, `explained` telling a person why."""
    if exc.retryable:
        return ApplicationError(str(exc), type=retried_as)
    return ApplicationError(explained, details, type=final_as, non_retryable=True)
