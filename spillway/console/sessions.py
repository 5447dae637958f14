"""The page's sign-in: a session cookie signed with the console's secret, naming the person and
the CSRF token every form of theirs carries. Nothing else is kept on the server, so a restarted
console keeps its sessions when its secret lives in SPILLWAY_SECRETS_DIR."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from spillway.core.settings import make_secret_file

SESSION_COOKIE = "spillway_console"
PRE_COOKIE = "spillway_console_signin"  # the sign-in form's own CSRF token (double submit)
SESSION_S = 12 * 3600  # a working day: a forgotten browser does not stay signed in for ever
SECRET_FILE = "SPILLWAY_CONSOLE_SECRET"  # noqa: S105 (a file's name)


@dataclass(frozen=True)
class Session:
    name: str
    csrf: str


def console_secret(folder: Path | None) -> bytes:
    """The key that signs cookies: kept in SPILLWAY_SECRETS_DIR (made there once), or one for
    this process only, whose sessions end with it."""
    if folder is None:
        return secrets.token_bytes(32)
    value, _ = make_secret_file(folder, SECRET_FILE)
    return value.encode()


class Signer:
    def __init__(self, key: bytes) -> None:
        self._key = key

    def _mac(self, body: bytes) -> str:
        return base64.urlsafe_b64encode(hmac.digest(self._key, body, hashlib.sha256)).decode()

    def seal(self, data: dict[str, object]) -> str:
        body = base64.urlsafe_b64encode(json.dumps(data, separators=(",", ":")).encode())
        return f"{body.decode()}.{self._mac(body)}"

    def open(self, value: str) -> dict[str, object] | None:
        body, _, mac = value.partition(".")
        if not mac or len(value) > 4096:
            return None
        if not hmac.compare_digest(self._mac(body.encode()), mac):
            return None
        try:
            data = json.loads(base64.urlsafe_b64decode(body.encode()))
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    def session_cookie(self, name: str) -> str:
        data: dict[str, object] = {
            "name": name,
            "csrf": secrets.token_urlsafe(24),
            "until": int(time.time()) + SESSION_S,
        }
        return self.seal(data)

    def session(self, value: str | None, now: float | None = None) -> Session | None:
        data = self.open(value) if value else None
        if data is None:
            return None
        name, csrf, until = data.get("name"), data.get("csrf"), data.get("until")
        if not isinstance(name, str) or not isinstance(csrf, str) or not isinstance(until, int):
            return None
        if until < (time.time() if now is None else now):
            return None
        return Session(name=name, csrf=csrf)


def same(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and hmac.compare_digest(a.encode(), b.encode())
