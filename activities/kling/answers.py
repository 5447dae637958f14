"""Kling's answers, read without I/O: what a create proves (money invariant 2) and what a query
says (docs/design.md, "Kling facts"). What is sent (request bodies, the JWT) is in requests.py.

Kling differs from MiniMax in one way that matters for money: `external_task_id` must be unique
per account and a task can be queried by it, so an ambiguous create is resolved by asking Kling
(the client's `reconcile`) instead of failing the job with "a charge may exist".

Nothing here ever holds a key; the client scrubs the keys from every message built from a
server's text.
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from activities.cloud.models import CreateVerdict

TaskStatus = Literal["submitted", "processing", "succeed", "failed"]
TASK_STATUSES: tuple[TaskStatus, ...] = ("submitted", "processing", "succeed", "failed")

# Kling's error-code table: code -> (HTTP status, meaning). The first block is docs/design.md's; the
# rest is from Kling's API reference ("General Information" → "Error Code", as copied in
# public repositories) but is not adopted by docs/design.md, so on a create those codes stay
# unknown (ambiguous, then reconcile); they only make messages and the double's answers precise.
CODES: dict[int, tuple[int, str]] = {
    0: (200, "request successful"),
    1000: (401, "authentication failed"),
    1001: (401, "Authorization is empty"),
    1002: (401, "Authorization is invalid"),
    1003: (401, "Authorization is not yet valid"),
    1004: (401, "Authorization has expired"),
    1100: (429, "account exception"),
    1101: (429, "account in arrears (postpaid)"),
    1102: (429, "resource pack used up or expired (prepaid)"),
    1303: (429, "parallel tasks over the resource pack's limit"),
    1103: (403, "no permission for the requested resource (API or model)"),
    1200: (400, "invalid request parameters"),
    1201: (400, "invalid parameter (wrong key or value)"),
    1202: (404, "invalid request method"),
    1203: (404, "requested resource does not exist"),
    1300: (400, "platform policy triggered"),
    1301: (400, "content safety policy triggered"),
    1302: (429, "requests too fast (platform rate limit)"),
    1304: (429, "IP whitelist policy triggered"),
    5000: (500, "server internal error"),
    5001: (503, "server temporarily unavailable (maintenance)"),
    5002: (504, "server internal timeout (backlog)"),
}
TOKEN_EXPIRED = 1004  # sign a fresh JWT and send again: the request was refused at the door
PARALLEL_LIMIT = 1303  # too many running tasks for the pack: wait for one to finish
# On a create these prove nothing was made and nothing will be for this account or key.
REFUSED_CODES = frozenset({1000, 1001, 1002, 1003, 1100, 1101, 1102})
# On a query these will not change by asking again: fix the keys or the account first.
QUERY_PERMANENT_CODES = frozenset({1000, 1001, 1002, 1003, 1100, 1103})
# How Kling answers a query for a task it does not have is not documented; the double answers
# 1203 ("requested resource does not exist"), the table's closest row.
TASK_NOT_FOUND = 1203


def describe(code: int) -> str:
    return CODES.get(code, (0, "code not in Kling's table"))[1]


# --- Kling's answers, as read here (tolerant of missing optional fields) ---------------------


class _Lenient(BaseModel):
    model_config = ConfigDict(coerce_numbers_to_str=True)


class KlingVideo(_Lenient):
    id: str = ""
    url: str
    duration: str = ""  # seconds, a string in Kling's answers ("5.042")


class _TaskResult(_Lenient):
    videos: list[KlingVideo] | None = None


class _TaskInfo(_Lenient):
    external_task_id: str | None = None


class _TaskData(_Lenient):
    task_id: str | None = None
    task_info: _TaskInfo | None = None
    task_status: str | None = None
    task_status_msg: str | None = None
    task_result: _TaskResult | None = None
    created_at: int | None = None
    updated_at: int | None = None
    # Resource-pack units the task used, a decimal string ("1.5"). Kling's API reference shows
    # it in the query answer's `data` as well as in the callback ("final_unit_deduction": the
    # task's final unit deduction; klingai.com/document-api/api/get-started/callbacks, old-style
    # callback; the query answer of /v1/videos/{kind}/{id} as copied from Kling's reference in
    # public repositories). Units, not money: what a unit costs depends on the pack bought.
    final_unit_deduction: str | None = None


class KlingEnvelope(_Lenient):
    """`{code, message, request_id, data}`, Kling's shape for every answer."""

    code: int
    message: str | None = None
    request_id: str | None = None
    data: _TaskData | None = None


class KlingTask(BaseModel):
    """One task as a query reports it."""

    task_id: str
    external_task_id: str | None = None
    status: TaskStatus
    message: str = ""  # task_status_msg: why a task failed (content policy, ...)
    videos: list[KlingVideo] = []
    units: float | None = None  # final_unit_deduction, when Kling reports it

    @property
    def video_urls(self) -> list[str]:
        return [v.url for v in self.videos]


class QueryProblem(BaseModel):
    """A query answer that is not a task. `not_found`: Kling says it has no such task."""

    message: str
    code: int | None = None
    http_status: int | None = None
    not_found: bool = False
    retryable: bool = True


def parse_envelope(body: Any) -> KlingEnvelope | None:
    """Kling's envelope from parsed JSON, raw text or bytes; None when it is not one."""
    if isinstance(body, str | bytes | bytearray):
        try:
            body = json.loads(body)
        except ValueError:
            return None
    try:
        return KlingEnvelope.model_validate(body)
    except ValidationError:
        return None


def _said(envelope: KlingEnvelope) -> str:
    own = (envelope.message or "").strip()
    text = f"Kling code {envelope.code} ({describe(envelope.code)})"
    return f"{text}: {own}" if own and own.lower() != describe(envelope.code).lower() else text


def classify_create(http_status: int | None, body: Any) -> CreateVerdict:
    """What a create answer proves. `http_status` None: no answer at all (timeout, dropped
    connection after sending). Only an explicit refusal code without a task id proves that
    nothing was made; everything else that is not a clear success is ambiguous."""
    if http_status is None:
        return CreateVerdict(outcome="ambiguous", message="no answer from Kling")
    if http_status >= 500:
        return CreateVerdict(outcome="ambiguous", message=f"Kling answered HTTP {http_status}")
    envelope = parse_envelope(body)
    if envelope is None:
        return CreateVerdict(
            outcome="ambiguous", message=f"the answer (HTTP {http_status}) is not Kling's"
        )
    code = envelope.code
    task_id = envelope.data.task_id if envelope.data is not None else None
    said = _said(envelope)
    if code == 0:
        if not task_id:
            return CreateVerdict(
                outcome="ambiguous", code=0, message="Kling answered success without a task id"
            )
        if not 200 <= http_status < 300:
            return CreateVerdict(
                outcome="ambiguous", code=0, task_id=task_id, message=f"HTTP {http_status}"
            )
        return CreateVerdict(outcome="created", code=0, task_id=task_id, message=said)
    if task_id:  # a refusal that names a task contradicts itself: a task may exist
        return CreateVerdict(outcome="ambiguous", code=code, task_id=task_id, message=said)
    if code == PARALLEL_LIMIT:
        return CreateVerdict(outcome="retry", code=code, rate_limited=True, message=said)
    if code == TOKEN_EXPIRED:
        return CreateVerdict(outcome="retry", code=code, message=said)
    if code in REFUSED_CODES:
        return CreateVerdict(outcome="refused", code=code, message=said)
    return CreateVerdict(outcome="ambiguous", code=code, message=said)


def read_query(http_status: int | None, body: Any) -> KlingTask | QueryProblem:
    """A query answer as a task, or the problem with it (polling is free: most problems are
    worth asking again)."""
    if http_status is None:
        return QueryProblem(message="no answer from Kling")
    envelope = parse_envelope(body)
    if envelope is None:
        return QueryProblem(
            message=f"the answer (HTTP {http_status}) is not Kling's", http_status=http_status
        )
    code = envelope.code
    if code != 0:
        return QueryProblem(
            message=_said(envelope),
            code=code,
            http_status=http_status,
            not_found=code == TASK_NOT_FOUND,
            retryable=code not in QUERY_PERMANENT_CODES,
        )
    data = envelope.data
    if not 200 <= http_status < 300 or data is None or not data.task_id:
        return QueryProblem(
            message=f"Kling answered code 0 with HTTP {http_status} and no task",
            code=0,
            http_status=http_status,
        )
    status = data.task_status
    if status not in TASK_STATUSES:
        return QueryProblem(
            message=f"Kling reports an unknown task status {status!r}", http_status=http_status
        )
    videos = (data.task_result.videos if data.task_result else None) or []
    return KlingTask(
        task_id=data.task_id,
        external_task_id=data.task_info.external_task_id if data.task_info else None,
        status=status,
        message=data.task_status_msg or "",
        videos=videos,
        units=_units(data.final_unit_deduction),
    )


def _units(text: str | None) -> float | None:
    try:
        units = float(text or "")
    except ValueError:
        return None
    return units if math.isfinite(units) and units >= 0 else None
