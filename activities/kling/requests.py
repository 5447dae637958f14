"""What spillway sends to Kling, built without I/O (docs/design.md, "Kling facts"): a job's
CloudRequest mapped onto Kling's request body, the key of its planning figure in
routing_tiers.json, the external id that makes a create safe to reconcile, and the JWT every
request carries.

The mapping from a job's CloudRequest (written for MiniMax) to Kling:
- image2video when the job has a first frame (its first input image, read by the activity and
  passed here as a data URL, or a URL) or the request a `first_frame_image`, else text2video;
- duration: Kling renders 5 or 10 s, MiniMax 6 or 10 s: a request for 10 s or more gets "10",
  anything shorter "5" (MiniMax's default 6 s becomes Kling's 5 s, the nearer length);
- aspect ratio 16:9 unless the request names one Kling renders (CloudRequest names none today);
  an image2video video takes its image's shape, so none is sent there;
- model and mode from the worker's settings (KLING_MODEL, KLING_MODE); the request's MiniMax
  model, resolution and prompt_optimizer have no Kling counterpart and are not sent.

Money invariant 3: the keys are only arguments of `sign_jwt`/`verify_jwt`, never kept here.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from typing import Any, Literal

from spillway.core.models import CloudRequest
from spillway.core.names import run_tag

Kind = Literal["text2video", "image2video"]
Mode = Literal["std", "pro"]
AspectRatio = Literal["16:9", "9:16", "1:1"]
ASPECT_RATIOS: tuple[AspectRatio, ...] = ("16:9", "9:16", "1:1")
DEFAULT_ASPECT_RATIO: AspectRatio = "16:9"
DEFAULT_MODEL = "kling-v2-6"
PROMPT_MAX_CHARS = 2500
DURATIONS = ("5", "10")
LONG_CLIP_S = 10  # a request for this many seconds or more gets Kling's 10 s clip
TOKEN_TTL_S = 1800  # exp = now + 1800, as Kling's own signing example
TOKEN_EARLY_S = 5  # nbf = now - 5: a little clock skew between us and Kling is tolerated


# --- a job's request, as Kling reads it --------------------------------------------------------


def kind_of(request: CloudRequest, has_first_frame: bool = False) -> Kind:
    return "image2video" if has_first_frame or request.first_frame_image else "text2video"


def duration_of(request: CloudRequest) -> str:
    return "10" if request.duration >= LONG_CLIP_S else "5"


def aspect_ratio_of(request: CloudRequest) -> AspectRatio:
    # CloudRequest has no aspect ratio yet; a later field of that name is honoured when Kling
    # renders it, and anything else keeps Kling's own default.
    wanted = getattr(request, "aspect_ratio", None)
    return next((a for a in ASPECT_RATIOS if a == wanted), DEFAULT_ASPECT_RATIO)


def cost_key(request: CloudRequest, settings_mode: str) -> str:
    """The key of a Kling clip's planning figure in routing_tiers.json: "<mode>/<duration>s",
    e.g. "std/5s" (Kling prices by mode and length, not by resolution)."""
    return f"{settings_mode}/{duration_of(request)}s"


def external_task_id(job_id: str, run_id: str) -> str:
    """Fixed per job and workflow run: every create of one run carries the same id, so Kling
    makes at most one task for it and an unanswered create can be looked up. A reset is a new
    run (and the spend ledger refuses its second create anyway)."""
    return f"spillway-{job_id}-{run_tag(run_id)}"


def external_task_ids(job_id: str, run_id: str) -> tuple[str, str]:
    """A lost create's possible ids: this release's, then 0.2.0's (the run id's first 8
    characters), so a create sent before an upgrade is still found."""
    return external_task_id(job_id, run_id), f"spillway-{job_id}-{run_id[:8]}"


def create_request(
    request: CloudRequest,
    *,
    external_task_id: str,
    model: str,
    mode: Mode,
    first_frame: str | None = None,
) -> tuple[Kind, dict[str, Any]]:
    """The endpoint kind and JSON body of a job's create; `first_frame` (a data URL or a URL)
    wins over the request's `first_frame_image`. Raises ValueError for what Kling would refuse
    (then nothing may be sent)."""
    image = first_frame or request.first_frame_image
    kind = kind_of(request, first_frame is not None)
    body = create_body(
        kind,
        external_task_id=external_task_id,
        prompt=request.prompt,
        model_name=model,
        mode=mode,
        aspect_ratio=aspect_ratio_of(request),
        duration=duration_of(request),
        image=image,
    )
    return kind, body


# --- request bodies ----------------------------------------------------------------------------

_DATA_URL = re.compile(r"^data:image/([\w.+-]+);base64,", re.IGNORECASE)
_KLING_IMAGE_TYPES = frozenset({"jpeg", "jpg", "png"})  # Kling takes JPG and PNG only
IMAGE_MAX_BYTES = 10_000_000  # Kling's limit on an image (docs/design.md, "Kling facts")


def _image(value: str) -> str:
    # Kling wants bare base64 or a URL; a data-URL prefix makes it refuse the image.
    value = value.strip()
    match = _DATA_URL.match(value)
    if match is None:
        return value
    if match.group(1).lower() not in _KLING_IMAGE_TYPES:
        raise ValueError(f"Kling takes JPG or PNG images, not image/{match.group(1)}")
    data = value[match.end() :]
    if len(data) // 4 * 3 > IMAGE_MAX_BYTES:  # base64: 4 characters per 3 bytes
        raise ValueError(f"Kling takes images of at most {IMAGE_MAX_BYTES} bytes")
    return data


def create_body(
    kind: Kind,
    *,
    external_task_id: str,
    prompt: str = "",
    model_name: str = DEFAULT_MODEL,
    negative_prompt: str = "",
    mode: Mode = "std",
    aspect_ratio: AspectRatio = DEFAULT_ASPECT_RATIO,
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
        if aspect_ratio not in ASPECT_RATIOS:
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
