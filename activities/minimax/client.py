"""HTTP to MiniMax (docs/design.md, "MiniMax facts"): one create request read into a verdict,
the free GETs (query, retrieve), and the video download from its pre-signed URL.

Money invariant 3: the key goes only into the Authorization header of requests to
MINIMAX_BASE_URL, never to the file host that serves the video, and every message built from a
server's text or an exception is scrubbed of it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, ValidationError

from activities.cloud.models import CreateVerdict
from activities.http import NOT_SENT, why
from activities.minimax.answers import classify_create
from spillway.core.settings import Settings, shown

_HEADER_SAFE = re.compile(r"[\x21-\x7e]+")
_A = TypeVar("_A", bound=BaseModel)


@dataclass(frozen=True)
class MiniMaxTiming:
    """How long the activities wait. Production keeps the defaults; tests shrink them."""

    heartbeat_every_s: float = 5.0  # well inside the workflow's 30 s heartbeat timeout
    connect_timeout_s: float = 10.0
    request_timeout_s: float = 20.0  # query, retrieve, and each read of a download
    # Retries of a create stop being started after this; with the last request (at most
    # MINIMAX_CREATE_TIMEOUT_S + 2 x connect) the activity ends within ~5 minutes.
    create_retry_budget_s: float = 210.0
    backoff_s: tuple[float, ...] = (2.0, 5.0, 10.0, 20.0, 30.0)  # the last one repeats
    # MiniMax allows a few video requests a minute: a rate limit waits much longer.
    rate_limit_backoff_s: tuple[float, ...] = (15.0, 30.0, 60.0)
    poll_backoff_max_s: float = 120.0
    url_refreshes: int = 3  # retrieve calls for fresh download URLs after the first expires

    def longest_create_s(self, answer_s: float) -> float:
        """The longest a create activity can run: what a worker's shutdown grace must exceed."""
        return self.create_retry_budget_s + 2 * self.connect_timeout_s + answer_s


class MiniMaxUnavailable(Exception):
    """A free call (query, retrieve, download) got no usable answer: try again later."""


class MiniMaxKeyProblem(Exception):
    """No usable key on this worker; the message says what to fix (never the key)."""


class MiniMaxClient:
    def __init__(self, http: httpx.AsyncClient, settings: Settings, timing: MiniMaxTiming) -> None:
        self._http, self._settings, self.timing = http, settings, timing
        self.base = str(settings.MINIMAX_BASE_URL).rstrip("/")

    def key(self) -> str:
        secret = self._settings.MINIMAX_API_KEY
        key = secret.get_secret_value().strip() if secret is not None else ""
        if not key:
            raise MiniMaxKeyProblem("no MiniMax API key on this worker: set MINIMAX_API_KEY")
        if not _HEADER_SAFE.fullmatch(key):
            # h11 would put the whole header, key included, into its error message.
            raise MiniMaxKeyProblem(
                "MINIMAX_API_KEY holds characters an HTTP header cannot carry: fix it"
            )
        return key

    async def create(self, key: str, body: dict[str, Any]) -> CreateVerdict:
        """One create request, read into what it proves; never raises for an outcome."""
        t, answer_s = self.timing, self._settings.MINIMAX_CREATE_TIMEOUT_S
        timeout = httpx.Timeout(answer_s, connect=t.connect_timeout_s, pool=t.connect_timeout_s)
        sent_at = datetime.now(UTC)
        try:
            # httpx bounds each network step; this bounds the whole exchange (a trickled
            # answer). It cannot fire before the connection exists: a TimeoutError is ambiguous.
            async with asyncio.timeout(t.connect_timeout_s * 2 + answer_s):
                response = await self._http.post(
                    f"{self.base}/v1/video_generation",
                    json=body,
                    headers=auth(key),
                    timeout=timeout,
                )
        except NOT_SENT as exc:
            return CreateVerdict(
                outcome="retry", message=f"could not connect ({self.clean(why(exc))})"
            )
        except asyncio.CancelledError:
            # Worker shutdown past its grace with the request in flight: say what it is.
            return CreateVerdict(
                outcome="ambiguous",
                message="the activity was cancelled while the request was in flight",
                sent_at=sent_at,
            )
        except httpx.WriteTimeout:
            return _ambiguous("sending the request timed out part-way", sent_at)
        except (httpx.TimeoutException, TimeoutError):
            return _ambiguous(f"no answer within {answer_s:g}s after the request was sent", sent_at)
        except httpx.HTTPError as exc:
            return _ambiguous(
                f"the connection failed after the request was sent ({self.clean(why(exc))})",
                sent_at,
            )
        try:
            body_json: Any = response.json()
        except ValueError:
            body_json = None
        verdict = classify_create(response.status_code, body_json)
        return verdict.model_copy(
            update={"message": self.clean(verdict.message), "sent_at": sent_at}
        )

    async def get(
        self, what: str, path: str, params: dict[str, str], key: str, model: type[_A]
    ) -> _A:
        """GET a free MiniMax endpoint; every failure is MiniMaxUnavailable (try again)."""
        t = self.timing
        timeout = httpx.Timeout(t.request_timeout_s, connect=t.connect_timeout_s)
        url = f"{self.base}{path}"
        try:
            async with asyncio.timeout(t.connect_timeout_s + t.request_timeout_s * 2):
                response = await self._http.get(
                    url, params=params, headers=auth(key), timeout=timeout
                )
        except (httpx.HTTPError, TimeoutError) as exc:
            raise MiniMaxUnavailable(
                f"MiniMax {what} got no answer from {shown(url)} ({self.clean(why(exc))})"
            ) from None
        if not response.is_success:
            raise MiniMaxUnavailable(f"MiniMax {what} answered HTTP {response.status_code}")
        try:
            return model.model_validate(response.json())
        except (ValueError, ValidationError):
            snippet = self.clean(response.text[:60].replace("\n", " "))
            raise MiniMaxUnavailable(
                f"MiniMax {what} answer is not MiniMax's ({snippet!r})"
            ) from None

    @asynccontextmanager
    async def stream(self, url: str) -> AsyncIterator[httpx.Response]:
        """The video from its pre-signed URL: no key is sent (the URL is often on a CDN)."""
        t = self.timing
        timeout = httpx.Timeout(t.request_timeout_s, connect=t.connect_timeout_s)
        async with self._http.stream("GET", url, timeout=timeout) as response:
            yield response

    def console(self) -> str:
        host = urlsplit(self.base).hostname or ""
        if host.startswith("api."):
            return f"the MiniMax console (https://platform.{host[4:]})"
        return f"the console of the MiniMax account behind {self.base}"

    def clean(self, text: str) -> str:
        """A server's text or an exception's message, never with the key in it."""
        secret = self._settings.MINIMAX_API_KEY
        key = secret.get_secret_value().strip() if secret is not None else ""
        text = text if len(text) <= 300 else text[:297] + "..."
        # A key too short to be real would garble every message it happens to occur in.
        return text.replace(key, "[MINIMAX_API_KEY]") if len(key) >= 6 else text


def _ambiguous(why_: str, sent_at: datetime) -> CreateVerdict:
    return CreateVerdict(outcome="ambiguous", message=why_, sent_at=sent_at)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}
