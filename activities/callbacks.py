"""`job_callback`: tells a job's owner, over plain HTTP, that the job completed, failed or was
cancelled, so any client (not only the CLI) learns the outcome without polling.

The body is the event's JSON (`event`, `job_id`, `plan`), sent the Standard Webhooks way
(standardwebhooks.com): `webhook-id` is the delivery id the workflow chooses, the same on every
retry of one event, so a receiver can drop duplicates; `webhook-timestamp` is the Unix time of
each attempt's send; `webhook-signature` is `v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<raw
body>">` keyed with the workers' JOB_WEBHOOK_SECRET (spillway.core.settings.webhook_key).
Signing the id and the time with the body lets a receiver refuse a replayed or re-dated delivery,
which the deprecated `X-Spillway-Signature: sha256=<hex HMAC of the body>` (still sent, with
`X-Spillway-Delivery` and `X-Spillway-Event`, for one release) cannot.

Only the workers' own JOB_WEBHOOK_URL is signed. A per-job URL is chosen by whoever submits the
job: signing what goes there with the workers' secret would hand any client valid signatures to
replay against the workers' receiver, so it goes out with id and timestamp but no signature.

A 2xx answer is done; anything else is a retryable failure. The workflow hands it to a child
workflow that outlives the job and retries it with CALLBACK_RETRY (below): the job never waits for
it nor fails because of it.

A webhook URL is a credential (a Slack or Mattermost URL posts as the app): no error, log line or
repr here contains it (docs/design.md, money invariant 3).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from datetime import timedelta
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from temporalio import activity
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

from activities import pinned
from activities.storage.opening import presign_outputs
from spillway.core import names
from spillway.core.addresses import Checked, Refused, check
from spillway.core.models import JobId, Plan, plan_json
from spillway.core.settings import Settings, webhook_key

CALLBACK_REFUSED = "CallbackRefused"  # the receiver answered, but not 2xx
CALLBACK_UNREACHABLE = "CallbackUnreachable"  # no answer: refused, reset, timed out
CALLBACK_BAD_URL = "CallbackBadUrl"  # a URL no retry can reach

# start_to_close of one attempt: the 10 s request and some slack.
CALLBACK_TIMEOUT = timedelta(seconds=15)
# 5 s, 10 s, 20 s ... capped at 10 min, 12 attempts: the last goes 50 min 35 s after the first
# (about 53 min when every attempt waits out its 10 s), so a receiver that is down for up to
# about 50 minutes still gets the event; a bad URL fails at once. Every attempt repeats the
# delivery id.
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
    # False when the workers have no JOB_WEBHOOK_SECRET, and always for a job's own URL.
    signed: bool


REQUEST_TIMEOUT_S = 10.0  # the whole request: connect, send, the answer's status line


def sign(body: bytes, secret: str) -> str:
    """`sha256=<hex HMAC-SHA256 of body>`: what the deprecated X-Spillway-Signature carries,
    keyed with the secret's text as given, whsec_ prefix and all."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def standard_signature(delivery_id: str, timestamp: int, body: bytes, key: bytes) -> str:
    """`v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">`: what webhook-signature carries."""
    signed = f"{delivery_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def signature_headers(delivery_id: str, body: bytes, secret: str | None) -> dict[str, str]:
    """The headers that identify and sign one attempt; `secret` None: identified, not signed.
    The timestamp is taken now, at the send: a receiver's tolerance (5 minutes in the
    standardwebhooks libraries) then holds for the last retry, 50 minutes after the event, too."""
    timestamp = int(time.time())
    headers = {
        "webhook-id": delivery_id,
        "webhook-timestamp": str(timestamp),
        "X-Spillway-Delivery": delivery_id,  # deprecated: webhook-id
    }
    if secret is not None:
        key = webhook_key(secret)
        headers["webhook-signature"] = standard_signature(delivery_id, timestamp, body, key)
        headers["X-Spillway-Signature"] = sign(body, secret)  # deprecated: webhook-signature
    return headers


class CallbackActivities:
    def __init__(self, http: httpx.AsyncClient, settings: Settings) -> None:
        self._http, self._settings = http, settings

    async def _as_shown(self, event: JobEvent) -> JobEvent:
        """The plan as `spillway status --json` shows it: outputs in object storage with a
        presigned `url`, signed afresh on every attempt so a late delivery still carries a
        working link."""
        try:
            plan = Plan.model_validate(event.plan)
        except ValidationError:  # not a whole plan: sent as the workflow gave it
            return event
        plan = await presign_outputs(plan, self._settings)
        return event.model_copy(update={"plan": json.loads(plan_json(plan))})

    @activity.defn(name=names.JOB_CALLBACK)
    async def job_callback(self, delivery: CallbackDelivery) -> CallbackResult:
        url = delivery.url
        if url is None and self._settings.JOB_WEBHOOK_URL is not None:
            url = self._settings.JOB_WEBHOOK_URL.get_secret_value()
        if url is None:
            return CallbackResult(status_code=None, signed=False)
        event = delivery.event.event
        checked: Checked | None = None
        if delivery.url is not None:  # the client's choice, unlike the workers' own URL
            try:
                checked = await check(delivery.url, self._settings.input_allow_hosts)
            except Refused as exc:
                raise ApplicationError(
                    f"callback {event} not sent: {exc}", type=CALLBACK_BAD_URL, non_retryable=True
                ) from None
        body = (await self._as_shown(delivery.event)).model_dump_json().encode()
        secret = self._signing_secret(delivery)
        headers = {
            "Content-Type": "application/json",
            "X-Spillway-Event": event,  # deprecated: the body's `event`
            **signature_headers(delivery.delivery_id, body, secret),
        }
        # Every error names the event and what went wrong, never the URL, and carries no cause:
        # httpx's exceptions (and Temporal's failure built from them) may quote it.
        try:
            async with (
                asyncio.timeout(REQUEST_TIMEOUT_S),
                pinned.client(checked, self._http) as http,
                http.stream(
                    "POST", url, content=body, headers=headers, timeout=REQUEST_TIMEOUT_S
                ) as response,
            ):
                status = response.status_code  # the answer's body is not read: not needed
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
            raise ApplicationError(
                f"callback {event} cannot be sent: the URL is not usable ({type(exc).__name__})",
                type=CALLBACK_BAD_URL,
                non_retryable=True,
            ) from None
        except (httpx.HTTPError, TimeoutError) as exc:
            raise ApplicationError(
                f"callback {event} not delivered: {type(exc).__name__} (no answer within "
                f"{REQUEST_TIMEOUT_S:g} s or the connection failed)",
                type=CALLBACK_UNREACHABLE,
            ) from None
        if not 200 <= status < 300:
            raise ApplicationError(
                f"callback {event} refused: the receiver answered HTTP {status}",
                type=CALLBACK_REFUSED,
            )
        activity.logger.info(
            "callback %s (%s) delivered: HTTP %d", delivery.delivery_id, event, status
        )
        return CallbackResult(status_code=status, signed=secret is not None)

    def _signing_secret(self, delivery: CallbackDelivery) -> str | None:
        if delivery.url is not None:
            activity.logger.info(
                "callback %s goes to the job's own URL: not signed with the workers' secret",
                delivery.delivery_id,
            )
            return None
        if self._settings.JOB_WEBHOOK_SECRET is None:
            activity.logger.warning(
                "JOB_WEBHOOK_SECRET is not set: callback %s goes out unsigned", delivery.delivery_id
            )
            return None
        return self._settings.JOB_WEBHOOK_SECRET.get_secret_value()
