"""The MiniMax contract (the CLOUD route): the activities' inputs and results, MiniMax's answers
as the activities read them, and what each of its status codes means.

No model here ever holds the API key: the activities read it from the worker's settings.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from spillway.models import CloudRequest, JobId

# base_resp.status_code values (DESIGN.md, "MiniMax facts"); 0 means ok. A transient code on a
# create means MiniMax made no task, so sending it again cannot charge twice.
TRANSIENT_CODES = frozenset({1000, 1001, 1002, 1013, 1024, 1033, 1039, 1041, 2045})
# Transient codes that are about request volume (rate, tokens, connections, growth): wait longer.
RATE_LIMIT_CODES = frozenset({1002, 1039, 1041, 2045})
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


class MiniMaxCreate(BaseModel):
    # JobId's pattern also keeps the job's output folder inside SPILLWAY_OUTPUT_DIR.
    job_id: JobId
    request: CloudRequest


class MiniMaxCreated(BaseModel):
    task_id: str
    # When MiniMax accepted the task (UTC) and how many create requests it took: every request
    # before the last one was answered with an explicit "no", so none of them made a task.
    created_at: datetime | None = None
    create_calls: int = 1


class MiniMaxPoll(BaseModel):
    job_id: JobId
    task_id: str


class MiniMaxDone(BaseModel):
    task_id: str
    file_id: str
    video_width: int | None = None
    video_height: int | None = None


class MiniMaxDownload(BaseModel):
    job_id: JobId
    task_id: str
    file_id: str


# --- MiniMax's answers, as read by the activities (HTTP 200 even for errors) ----------------


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


# What a person should do about each permanent code (DESIGN.md, "MiniMax facts").
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
