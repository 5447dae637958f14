"""MiniMax's answers as spillway reads them, and what each status code proves (docs/design.md,
"MiniMax facts"). Pure: no I/O. `classify_create` is the money-deciding step of the CLOUD route
and has a table test of its own.

MiniMax answers HTTP 200 even for errors: `base_resp.status_code` (0 = ok) is the answer.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from activities.cloud.models import CreateVerdict

# Codes about request volume (rate, tokens, connections, growth). On a create WITH an empty
# task_id they prove nothing was made: send again after a (longer) backoff.
RATE_LIMIT_CODES = frozenset({1002, 1039, 1041, 2045})
# "unknown error", "timeout", "internal error", "system error": retry later on a query or a
# retrieve, but on a create they do NOT prove that no task was made (ambiguous).
SERVER_TROUBLE_CODES = frozenset({1000, 1001, 1013, 1024, 1033})
# Retried as they are on query and retrieve (nothing there costs money).
TRANSIENT_CODES = RATE_LIMIT_CODES | SERVER_TROUBLE_CODES
PERMANENT_CODES = frozenset({1004, 2049, 1008, 1026, 1027, 1042, 2013, 2038, 2056})
# MiniMax's own status_msg for each code (its error-code reference), as the double sends them.
STATUS_MSGS: dict[int, str] = {
    0: "success",
    1000: "unknown error",
    1001: "request timeout",
    1002: "rate limit",
    1004: "not authorized / token not match group / cookie is missing, log in again",
    1008: "insufficient balance",
    1013: "internal service error",
    1024: "internal error",
    1026: "input new_sensitive",
    1027: "output new_sensitive",
    1033: "system error / mysql failed",
    1039: "token limit",
    1041: "conn limit",
    1042: "invisible character ratio limit",
    2013: "invalid params",
    2038: "no permission",
    2045: "rate growth limit",
    2049: "invalid api key",
    2056: "usage limit exceeded",
}


class BaseResp(BaseModel):
    status_code: int
    status_msg: str = ""


class CreateAnswer(BaseModel):
    task_id: str = ""
    base_resp: BaseResp


class QueryAnswer(BaseModel):
    task_id: str = ""
    status: str = ""
    file_id: str | int | None = None  # a string in this answer; tolerate a number
    video_width: int | None = None
    video_height: int | None = None
    base_resp: BaseResp


class FileInfo(BaseModel):
    file_id: int | str  # an integer in this answer (a string in the query's)
    bytes: int = 0  # MiniMax has been seen to answer 0: then the size is unknown
    filename: str = ""
    download_url: str


class RetrieveAnswer(BaseModel):
    file: FileInfo | None = None
    base_resp: BaseResp


def classify_create(http_status: int, body: Any) -> CreateVerdict:
    """What an answer to `POST /v1/video_generation` proves. Only two kinds of answer prove that
    nothing was made: a rate or volume refusal with an empty task id (`retry`) and a permanent
    refusal with an empty task id (`refused`). Everything else that is not a clean success
    may have made a task (`ambiguous`)."""
    if http_status >= 500:
        return CreateVerdict(outcome="ambiguous", message=f"MiniMax answered HTTP {http_status}")
    try:
        answer = CreateAnswer.model_validate(body)
    except ValidationError:
        return CreateVerdict(
            outcome="ambiguous",
            message=f"MiniMax's answer (HTTP {http_status}) is not a MiniMax answer",
        )
    code, msg, task_id = answer.base_resp.status_code, answer.base_resp.status_msg, answer.task_id
    if code == 0:
        if not 200 <= http_status < 300:
            return CreateVerdict(
                outcome="ambiguous", message=f"MiniMax answered HTTP {http_status}"
            )
        if not task_id:
            return CreateVerdict(
                outcome="ambiguous", code=0, message="MiniMax answered success without a task id"
            )
        return CreateVerdict(outcome="created", task_id=task_id, code=0, message=msg)
    said = f"code {code} ({msg})" if msg else f"code {code}"
    if task_id:
        return CreateVerdict(
            outcome="ambiguous",
            task_id=task_id,
            code=code,
            message=f"MiniMax answered {said} together with task id {task_id}",
        )
    if code in RATE_LIMIT_CODES:
        return CreateVerdict(outcome="retry", code=code, message=said, rate_limited=True)
    if code in PERMANENT_CODES:
        return CreateVerdict(outcome="refused", code=code, message=msg)
    if code in SERVER_TROUBLE_CODES:
        return CreateVerdict(
            outcome="ambiguous",
            code=code,
            message=f"MiniMax answered {said}, which does not prove that no task was made",
        )
    return CreateVerdict(outcome="ambiguous", code=code, message=f"MiniMax answered unknown {said}")


# What a person should do about each permanent code (docs/design.md, "MiniMax facts").
_PERMANENT_ADVICE: dict[int, str] = {
    1004: "MiniMax rejected the API key (code 1004, not authorized): set a valid "
    "MINIMAX_API_KEY on the worker",
    2049: "MiniMax says the API key is invalid (code 2049): set a valid MINIMAX_API_KEY on "
    "the worker (a key of the account behind MINIMAX_BASE_URL)",
    1008: "MiniMax balance is empty (code 1008): top up",
    1026: "MiniMax refused the prompt or first frame as sensitive content (code 1026): "
    "change the input",
    1027: "MiniMax refused the generated video as sensitive content (code 1027): change the prompt",
    1042: "MiniMax refused the prompt for its share of invisible or illegal characters "
    "(code 1042): clean the prompt",
    2013: "MiniMax rejected the request's parameters (code 2013): check model, resolution, "
    "duration and first frame image",
    2038: "MiniMax refused the account (code 2038): check its permissions and verification "
    "in the MiniMax console",
    2056: "MiniMax usage limit exceeded (code 2056): wait for the next quota window",
}


def permanent_message(code: int, status_msg: str, *, task_id: str | None) -> str:
    advice = _PERMANENT_ADVICE.get(code, f"MiniMax refused the request (code {code})")
    said = f" [MiniMax: {status_msg!r}]" if status_msg else ""
    if task_id is None:  # from a create: MiniMax said no, so no task and no charge exist
        return f"{advice}, then resubmit the job{said}"
    return (
        f"{advice}{said}. MiniMax task {task_id} exists and may still finish and be charged; "
        "spillway stopped following it"
    )
