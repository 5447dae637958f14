"""Kling's answers, read without I/O: what a create proves (money invariant 2), what a query
says, the request bodies, and the JWT every request carries (docs/design.md, "Kling facts").

Kling differs from MiniMax in one way that matters for money: `external_task_id` must be unique
per account and a task can be queried by it, so an ambiguous create is resolved by asking Kling
(the client's `reconcile`) instead of failing the job with "a charge may exist".

Nothing here ever holds a key beyond the arguments of `sign_jwt`/`verify_jwt`; the client scrubs
the keys from every message built from a server's text.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from spillway.cloud_models import CreateVerdict

Kind = Literal["text2video", "image2video"]
Mode = Literal["std", "pro"]
AspectRatio = Literal["16:9", "9:16", "1:1"]
TaskStatus = Literal["submitted", "processing", "succeed", "failed"]
TASK_STATUSES: tuple[TaskStatus, ...] = ("submitted", "processing", "succeed", "failed")
DEFAULT_MODEL = "kling-v2-6"
PROMPT_MAX_CHARS = 2500
DURATIONS = ("5", "10")
TOKEN_TTL_S = 1800  # exp = now + 1800, as Kling's own signing example
TOKEN_EARLY_S = 5  # nbf = now - 5: a little clock skew between us and Kling is tolerated

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
    )


# --- request bodies -------------------------------------------------------------------------

_DATA_URL = re.compile(r"^data:image/[\w.+-]+;base64,", re.IGNORECASE)


def _image(value: str) -> str:
    # Kling wants bare base64 or a URL; a data-URL prefix makes it refuse the image.
    return _DATA_URL.sub("", value.strip())


def create_body(
    kind: Kind,
    *,
    external_task_id: str,
    prompt: str = "",
    model_name: str = DEFAULT_MODEL,
    negative_prompt: str = "",
    mode: Mode = "std",
    aspect_ratio: AspectRatio = "16:9",
    duration: str | int = "5",
    image: str | None = None,
    image_tail: str | None = None,
    callback_url: str | None = None,
) -> dict[str, Any]:
    """The JSON of `POST /v1/videos/{kind}`. `external_task_id` is required: it is what makes
    a Kling create safe to reconcile and to send again. `aspect_ratio` is text2video's only
    (an image2video video takes the image's). Raises ValueError for what Kling would refuse."""
    if not external_task_id.strip():
        raise ValueError("external_task_id is required: it makes the create idempotent")
    if len(prompt) > PROMPT_MAX_CHARS or len(negative_prompt) > PROMPT_MAX_CHARS:
        raise ValueError(f"prompt and negative_prompt are limited to {PROMPT_MAX_CHARS} chars")
    if str(duration) not in DURATIONS:
        raise ValueError(f"duration must be one of {DURATIONS}, not {duration!r}")
    if mode not in ("std", "pro"):
        raise ValueError(f"mode must be std or pro, not {mode!r}")
    body: dict[str, Any] = {"model_name": model_name}
    if kind == "text2video":
        if not prompt.strip():
            raise ValueError("text2video needs a prompt")
        if image is not None or image_tail is not None:
            raise ValueError("text2video takes no image: use image2video")
        if aspect_ratio not in ("16:9", "9:16", "1:1"):
            raise ValueError(f"aspect_ratio must be 16:9, 9:16 or 1:1, not {aspect_ratio!r}")
        body |= {"prompt": prompt, "aspect_ratio": aspect_ratio}
    else:
        if not (image or image_tail):
            raise ValueError("image2video needs an image (or an image_tail)")
        if image:
            body["image"] = _image(image)
        if image_tail:
            body["image_tail"] = _image(image_tail)
        if prompt:
            body["prompt"] = prompt
    if negative_prompt:
        body["negative_prompt"] = negative_prompt
    body |= {"mode": mode, "duration": str(duration), "external_task_id": external_task_id}
    if callback_url:
        body["callback_url"] = callback_url
    return body


# --- the JWT of every request (HS256, RFC 7519), signed here: no new dependency --------------

JWT_MALFORMED = "malformed token"
JWT_BAD_SIGNATURE = "signature does not match"
JWT_WRONG_ISSUER = "issuer is not this account's access key"
JWT_NOT_YET_VALID = "token not yet valid (nbf)"
JWT_EXPIRED = "token expired (exp)"
_HEADER = {"alg": "HS256", "typ": "JWT"}


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _json(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _signature(signing_input: str, secret_key: str) -> str:
    mac = hmac.new(secret_key.encode(), signing_input.encode("ascii"), hashlib.sha256)
    return _b64(mac.digest())


def sign_jwt(access_key: str, secret_key: str, now: int) -> str:
    """Kling's API token: iss = access key, valid from now - 5 s to now + 30 min."""
    claims = {"iss": access_key, "exp": now + TOKEN_TTL_S, "nbf": now - TOKEN_EARLY_S}
    signing_input = f"{_b64(_json(_HEADER))}.{_b64(_json(claims))}"
    return f"{signing_input}.{_signature(signing_input, secret_key)}"


def verify_jwt(token: str, access_key: str, secret_key: str, now: int) -> str | None:
    """None when `token` is valid for this account at `now`, else why not (one of the JWT_*
    constants; never a key)."""
    parts = token.split(".")
    if len(parts) != 3:
        return JWT_MALFORMED
    try:
        header = json.loads(_unb64(parts[0]))
        claims = json.loads(_unb64(parts[1]))
    except (ValueError, binascii.Error):
        return JWT_MALFORMED
    if not isinstance(header, dict) or header.get("alg") != "HS256":
        return JWT_MALFORMED
    if not isinstance(claims, dict):
        return JWT_MALFORMED
    try:
        expected = _signature(f"{parts[0]}.{parts[1]}", secret_key)
    except UnicodeEncodeError:
        return JWT_MALFORMED
    if not hmac.compare_digest(expected.encode(), parts[2].encode("ascii", "replace")):
        return JWT_BAD_SIGNATURE
    if not hmac.compare_digest(str(claims.get("iss", "")).encode(), access_key.encode()):
        return JWT_WRONG_ISSUER
    exp, nbf = claims.get("exp"), claims.get("nbf")
    if not isinstance(exp, int) or (nbf is not None and not isinstance(nbf, int)):
        return JWT_MALFORMED
    if nbf is not None and now < nbf:
        return JWT_NOT_YET_VALID
    if now >= exp:
        return JWT_EXPIRED
    return None
