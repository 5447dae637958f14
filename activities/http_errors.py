"""How an exception reads inside a one-line error message, for every activity that talks HTTP.

httpx's exceptions often carry no text at all (a bare `ReadTimeout`), so the type name always
comes first: "ReadTimeout", "ConnectError: [Errno 111] Connection refused".
"""

from __future__ import annotations


def why(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
