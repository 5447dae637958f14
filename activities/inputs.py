"""Reading a job's input image where it is stored (docs/design.md, "Clients, inputs and
outputs"): in the output store (s3:// or file:// under SPILLWAY_OUTPUT_DIR) or at a URL the
client gave. The ComfyUI upload and the cloud creates use it.

The bytes stay in memory only as long as the activity needs them and appear in no message: errors
name the input's node and where it is, never its content (nor a URL's query, which may be a
signature). A URL is fetched only if spillway.core.addresses allows it, checked again at every
redirect, and only from the addresses that check resolved (activities/pinned.py); a failed fetch
says "could not fetch", never how (which ports answer is not for a client to learn). What was
read must be an image of the kinds spillway takes before anything is uploaded or sent.
"""

from __future__ import annotations

import base64
import hashlib

import httpx

from activities import pinned
from activities.storage.store import OutputStore, StoreError
from spillway.core.addresses import Refused, check
from spillway.core.images import ACCEPTED, MAX_INPUT_BYTES, sniff
from spillway.core.models import JobInput
from spillway.core.settings import shown

URL_TIMEOUT = httpx.Timeout(30.0, connect=10.0)
MAX_REDIRECTS = 5


class InputUnreadable(Exception):
    """The input could not be read, or is not what was submitted; `retryable` says whether
    trying again later may help."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


def where(item: JobInput) -> str:
    return shown(item.uri)


async def read_input(
    store: OutputStore,
    http: httpx.AsyncClient,
    item: JobInput,
    limit: int = MAX_INPUT_BYTES,
    *,
    allow: frozenset[str],
) -> bytes:
    """The input's bytes, checked against its sha256 when it has one and to be an image.
    `allow`: SPILLWAY_INPUT_ALLOW_HOSTS."""
    label = f"the input of node {item.node} ({where(item)})"
    if item.uri.startswith(("s3://", "file://")):
        try:
            data = await store.read(item.uri, limit)
        except StoreError as exc:
            raise InputUnreadable(f"{label}: {exc}", retryable=exc.retryable) from None
    elif item.uri.startswith(("http://", "https://")):
        data = await _fetch(http, item.uri, limit, label, allow)
    else:
        raise InputUnreadable(f"{label}: not an s3://, file:// or http(s) URI", retryable=False)
    if item.sha256 is not None and hashlib.sha256(data).hexdigest() != item.sha256:
        raise InputUnreadable(
            f"{label} is not the file submitted (its sha256 differs): submit the job again",
            retryable=False,
        )
    info = sniff(data)
    if info is None or info.format not in ACCEPTED:
        kinds = ", ".join(f.upper() for f in ACCEPTED)
        raise InputUnreadable(
            f"{label} is not a {kinds} image: nothing was uploaded or sent", retryable=False
        )
    return data


async def _fetch(
    http: httpx.AsyncClient, url: str, limit: int, label: str, allow: frozenset[str]
) -> bytes:
    for _ in range(MAX_REDIRECTS + 1):
        try:
            checked = await check(url, allow)
        except Refused as exc:
            raise InputUnreadable(f"{label}: {exc}", retryable=False) from None
        unreadable = InputUnreadable(f"{label}: could not fetch {shown(url)}", retryable=True)
        try:
            async with (
                pinned.client(checked, http) as reaching,
                reaching.stream(
                    "GET", url, timeout=URL_TIMEOUT, follow_redirects=False
                ) as response,
            ):
                if response.is_redirect and "location" in response.headers:
                    url = str(response.url.join(response.headers["location"]))
                    continue
                if not response.is_success:
                    # A refusal may pass; a page that is not there will not appear.
                    unreadable.retryable = (
                        response.status_code >= 500 or response.status_code == 429
                    )
                    raise unreadable
                data = bytearray()
                async for chunk in response.aiter_bytes():
                    data += chunk
                    if len(data) > limit:
                        raise InputUnreadable(f"{label}: over {limit} bytes", retryable=False)
                return bytes(data)
        except httpx.HTTPError:
            raise unreadable from None
    raise InputUnreadable(f"{label}: more than {MAX_REDIRECTS} redirects", retryable=False)


def data_url(data: bytes) -> str:
    """`data:image/<format>;base64,...`: the image carried inside a request, as MiniMax's
    first_frame_image and (without the prefix) Kling's image take it."""
    info = sniff(data)
    mime = info.mime if info is not None else "application/octet-stream"
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
