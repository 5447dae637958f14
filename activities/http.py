"""What an HTTP failure tells the activities that talk to ComfyUI, the clouds, the guard and
webhooks: whether the request can have reached the server, and how it reads in a one-line
error message."""

from __future__ import annotations

import re

import httpx

# Raised before a single byte of the request left this machine: safe to send again.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
# Raised after the request (or part of it) left: the server may have it and act on it.
MAYBE_SENT = (
    httpx.ReadTimeout,
    httpx.WriteTimeout,
    httpx.ReadError,
    httpx.WriteError,
    httpx.RemoteProtocolError,
)


def why(exc: BaseException) -> str:
    """httpx's exceptions often carry no text at all (a bare `ReadTimeout`), so the type name
    always comes first: "ReadTimeout", "ConnectError: [Errno 111] Connection refused"."""
    # Some quote the URL, whose user-info is a password.
    text = _USER_INFO.sub("//", str(exc).strip())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# To the last `@` of the URL (as spillway.core.settings.shown reads it): a password may hold an
# unencoded `/` or `@`, and more of a URL hidden is the safe side.
_USER_INFO = re.compile(r"//[^\s?#]*@")
