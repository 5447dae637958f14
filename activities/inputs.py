"""Reading a job's input image where it is stored (docs/design.md, "Clients, inputs and
outputs"): in the output store (s3:// or file:// under SPILLWAY_OUTPUT_DIR) or at a URL the
client gave. The ComfyUI upload and the cloud creates use it.

The bytes stay in memory only as long as the activity needs them and appear in no message: errors
name the input's node and where it is, never its content (nor a URL's query, which may be a
signature).
"""

from __future__ import annotations

import base64
import hashlib
from urllib.parse import urlsplit

import httpx

from activities.http import why
from activities.storage.store import OutputStore, StoreError
from spillway.images import MAX_INPUT_BYTES, sniff
from spillway.models import JobInput

URL_TIMEOUT = httpx.Timeout(30.0, connect=10.0)


class InputUnreadable(Exception):
    """The input could not be read, or is not what was submitted; `retryable` says whether
    trying again later may help."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


def where(item: JobInput) -> str:
    parts = urlsplit(item.uri)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"


async def read_input(
    store: OutputStore, http: httpx.AsyncClient, item: JobInput, limit: int = MAX_INPUT_BYTES
) -> bytes:
    """The input's bytes, checked against its sha256 when it has one."""
    label = f"the input of node {item.node} ({where(item)})"
    if item.uri.startswith(("s3://", "file://")):
        try:
            data = await store.read(item.uri, limit)
        except StoreError as exc:
            raise InputUnreadable(f"{label}: {exc}", retryable=exc.retryable) from None
    elif item.uri.startswith(("http://", "https://")):
        data = await _fetch(http, item.uri, limit, label)
    else:
        raise InputUnreadable(f"{label}: not an s3://, file:// or http(s) URI", retryable=False)
    if item.sha256 is not None and hashlib.sha256(data).hexdigest() != item.sha256:
        raise InputUnreadable(
            f"{label} is not the file submitted (its sha256 differs): submit the job again",
            retryable=False,
        )
    return data


async def _fetch(http: httpx.AsyncClient, url: str, limit: int, label: str) -> bytes:
    try:
        async with http.stream("GET", url, timeout=URL_TIMEOUT) as response:
            if response.status_code >= 500 or response.status_code == 429:
                raise InputUnreadable(
                    f"{label}: answered HTTP {response.status_code}", retryable=True
                )
            if not response.is_success:
                raise InputUnreadable(
                    f"{label}: answered HTTP {response.status_code}", retryable=False
                )
            data = bytearray()
            async for chunk in response.aiter_bytes():
                data += chunk
                if len(data) > limit:
                    raise InputUnreadable(f"{label}: over {limit} bytes", retryable=False)
            return bytes(data)
    except httpx.HTTPError as exc:
        raise InputUnreadable(f"{label}: {why(exc)}", retryable=True) from None


def data_url(data: bytes) -> str:
    """`data:image/<format>;base64,...`: the image carried inside a request, as MiniMax's
    first_frame_image and (without the prefix) Kling's image take it."""
    info = sniff(data)
    mime = info.mime if info is not None else "application/octet-stream"
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
