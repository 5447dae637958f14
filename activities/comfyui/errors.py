"""How the LOCAL route's activities fail: the ComfyUI client's, the answers' and the output
store's exceptions as the ApplicationError types the workflow's retry policies name, and a
finished prompt's history entry as its outcome or its non-retryable failure."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from temporalio.exceptions import ApplicationError

from activities.comfyui.answers import PromptFailed, UnsafePath, outcome_of
from activities.comfyui.client import OutputMissing, Unavailable, UploadRefused
from activities.comfyui.models import (
    INPUT_UNREADABLE,
    OUTPUT_MISSING,
    UNAVAILABLE,
    UNSAFE_PATH,
    UPLOAD_REFUSED,
    ComfyUIFinished,
)
from activities.inputs import InputUnreadable
from activities.storage.store import StoreError, UnsafeName


def finished(prompt_id: str, entry: dict[str, Any]) -> ComfyUIFinished:
    outcome = outcome_of(prompt_id, entry)
    if isinstance(outcome, PromptFailed):
        details = () if outcome.details is None else (outcome.details,)
        raise ApplicationError(
            outcome.message, *details, type=outcome.error_type, non_retryable=True
        )
    return outcome


@contextlib.contextmanager
def activity_errors() -> Iterator[None]:
    """The client's and the answers' exceptions as the ApplicationError types retry policies
    name. The cause stays what explains them (httpx's error, a short download), not our wrapper."""
    try:
        yield
    except Unavailable as exc:
        raise ApplicationError(str(exc), type=UNAVAILABLE) from exc.__cause__
    except OutputMissing as exc:
        raise ApplicationError(str(exc), type=OUTPUT_MISSING, non_retryable=True) from None
    except (UnsafePath, UnsafeName) as exc:
        raise ApplicationError(str(exc), type=UNSAFE_PATH, non_retryable=True) from None
    except UploadRefused as exc:
        raise ApplicationError(str(exc), type=UPLOAD_REFUSED, non_retryable=True) from None
    except InputUnreadable as exc:
        raise ApplicationError(
            str(exc), type=INPUT_UNREADABLE, non_retryable=not exc.retryable
        ) from None
    except StoreError as exc:
        raise exc.failure() from None
