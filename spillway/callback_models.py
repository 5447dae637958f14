"""What a completion callback carries (the event a job's owner is told about, one delivery of
it) and how a workflow runs the `job_callback` activity (activities/callbacks.py).

How one is sent, from the end of VideoJobWorkflow: a child workflow (workflows/callbacks.py) runs
the activity with CALLBACK_RETRY, started with `parent_close_policy=ParentClosePolicy.ABANDON`;
the job awaits only its start and returns. Not
`workflow.start_activity` without awaiting it: an activity still scheduled when its workflow
completes is never run nor retried (the server drops it with the closed run; a test shows it), and
awaiting it would hold the job open for as long as the receiver is down."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from temporalio.common import RetryPolicy

from spillway.models import JobId

CALLBACK_REFUSED = "CallbackRefused"  # the receiver answered, but not 2xx
CALLBACK_UNREACHABLE = "CallbackUnreachable"  # no answer: refused, reset, timed out
CALLBACK_BAD_URL = "CallbackBadUrl"  # a URL no retry can reach

# start_to_close of one attempt: the 10 s request and some slack.
CALLBACK_TIMEOUT = timedelta(seconds=15)
# 5 s, 10 s, 20 s ... capped at 10 min, 12 attempts (~1 h 10 min in all): a receiver that is down
# for an hour still gets the event; a bad URL fails at once. Every attempt repeats the delivery id.
CALLBACK_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=5),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(minutes=10),
    maximum_attempts=12,
    non_retryable_error_types=[CALLBACK_BAD_URL],
)

EventName = Literal["job.completed", "job.failed", "job.cancelled"]


class JobEvent(BaseModel):
    """The JSON body of a callback, exactly as signed and sent."""

    event: EventName
    job_id: JobId
    plan: dict[str, Any]  # the job's plan, as `spillway status --json` shows it


class CallbackDelivery(BaseModel):
    # A webhook URL is a credential (a Slack URL posts as the app): pydantic's errors and this
    # model's repr never show it.
    model_config = ConfigDict(hide_input_in_errors=True)

    # The job's own --callback-url; None: the worker's JOB_WEBHOOK_URL (or nothing is sent).
    url: str | None = Field(default=None, repr=False)
    # Chosen by the workflow (e.g. "<job id>:<event>"): every retry of one event carries it, so
    # the receiver can drop duplicates.
    delivery_id: str = Field(min_length=1, max_length=200)
    event: JobEvent

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("a callback URL must start with http:// or https://")
        return value


class CallbackResult(BaseModel):
    status_code: int | None  # the receiver's 2xx answer; None when no URL was configured
    signed: bool  # False when the worker has no JOB_WEBHOOK_SECRET
