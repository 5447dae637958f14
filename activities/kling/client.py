"""An HTTP client of Kling's video API: create, query (by task id or by our external id),
reconcile an ambiguous create, and stream a finished video. No Temporal here: the activities
that use it decide what a verdict means for the job.

Money invariant 2: a create's answer is read by `classify_create` alone. Kling creates carry our
`external_task_id`, which Kling keeps unique per account, so an ambiguous create is settled by
`reconcile` (asking Kling whether the task exists) rather than by giving up.

Money invariant 3: both keys stay in this object. Each request carries a fresh JWT (never the
keys); the video URL, on a CDN, gets no Authorization header at all; every message built from
a server's text or an exception is scrubbed of the keys and of any JWT.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from activities.cloud.models import CreateVerdict
from activities.http import NOT_SENT
from activities.kling.answers import (
    TOKEN_EXPIRED,
    KlingTask,
    QueryProblem,
    classify_create,
    read_query,
)
from activities.kling.requests import Kind, sign_jwt

_JWT = re.compile(r"eyJ[\w-]*\.[\w-]+\.[\w-]+")


@dataclass(frozen=True)
class KlingTiming:
    """How long the client and the activities wait. Production keeps the defaults; tests shrink
    them."""

    connect_timeout_s: float = 10.0
    create_timeout_s: float = 30.0  # KLING_CREATE_TIMEOUT_S: past it the create is unclear
    request_timeout_s: float = 20.0  # a query, and each read of a video download
    heartbeat_every_s: float = 5.0  # well inside the workflow's 30 s heartbeat timeout
    # Sending again (a provable "not now") and asking Kling about an unanswered create stop
    # being started after this; see longest_create_s for the activity's whole bound.
    create_retry_budget_s: float = 200.0
    backoff_s: tuple[float, ...] = (2.0, 5.0, 10.0, 20.0, 30.0)  # the last one repeats
    # 1303: the pack's parallel tasks are all busy; one takes minutes to finish.
    rate_limit_backoff_s: tuple[float, ...] = (15.0, 30.0, 60.0)
    poll_backoff_max_s: float = 120.0
    # A poll that finds no task under either kind this many times in a row gives up.
    unknown_task_polls: int = 6

    def create_exchange_s(self) -> float:
        """The longest one `KlingClient.create` can take (two requests after "token expired")."""
        return 2 * (self.connect_timeout_s * 2 + self.create_timeout_s)

    def longest_create_s(self) -> float:
        """The longest a create activity can run: what a worker's shutdown grace must exceed
        (SPILLWAY_SHUTDOWN_GRACE_S, 330 s by default). A reconcile takes no longer than a create."""
        return self.create_retry_budget_s + self.create_exchange_s()


class KlingError(Exception):
    """A query or download that did not give an answer to act on. `retryable`: asking again
    later may help (polling and downloading cost nothing); the message never holds a key."""

    def __init__(
        self,
        message: str,
        *,
        code: int | None = None,
        http_status: int | None = None,
        retryable: bool = True,
    ) -> None:
        super().__init__(message)
        self.code, self.http_status, self.retryable = code, http_status, retryable


class KlingClient:
    def __init__(
        self,
        http: httpx.AsyncClient,
        base_url: str,
        access_key: str,
        secret_key: str,
        timing: KlingTiming | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._http, self._base = http, base_url.rstrip("/")
        self._access_key, self._secret_key = access_key.strip(), secret_key.strip()
        self._timing = timing or KlingTiming()
        self._clock = clock

    # --- create: the only call that costs money -------------------------------------------

    async def create(self, kind: Kind, body: dict[str, Any]) -> CreateVerdict:
        """POST /v1/videos/{kind} once (twice when Kling says the token expired: that refusal
        happens before anything is made). Never raises for what Kling or the network did; a
        cancellation while the request is in flight propagates and is as ambiguous as a
        timeout (the caller reconciles)."""
        if not str(body.get("external_task_id") or "").strip():
            # Without it an ambiguous create could never be reconciled: refuse before sending.
            raise ValueError("a Kling create needs an external_task_id (see create_body)")
        for attempt in (1, 2):
            sent_at = datetime.now(UTC)
            verdict = await self._create_once(kind, body)
            verdict = verdict.model_copy(
                update={"message": self.clean(verdict.message), "sent_at": sent_at}
            )
            if verdict.outcome == "retry" and verdict.code == TOKEN_EXPIRED and attempt == 1:
                continue  # our clock or Kling's moved on: the next request signs a fresh token
            return verdict.model_copy(update={"attempts": attempt})
        raise AssertionError("unreachable")  # pragma: no cover

    async def _create_once(self, kind: Kind, body: dict[str, Any]) -> CreateVerdict:
        t = self._timing
        timeout = httpx.Timeout(
            t.create_timeout_s, connect=t.connect_timeout_s, pool=t.connect_timeout_s
        )
        try:
            # httpx bounds each network step; this bounds the whole exchange (a trickled
            # answer). It cannot fire before a connection exists, so it means ambiguous.
            async with asyncio.timeout(t.connect_timeout_s * 2 + t.create_timeout_s):
                response = await self._http.post(
                    f"{self._base}/v1/videos/{kind}",
                    json=body,
                    headers=self._auth(),
                    timeout=timeout,
                )
        except NOT_SENT as exc:
            return CreateVerdict(outcome="retry", message=f"could not connect ({self._why(exc)})")
        except httpx.WriteTimeout:
            return CreateVerdict(outcome="ambiguous", message="sending the create timed out")
        except (httpx.TimeoutException, TimeoutError):
            return CreateVerdict(
                outcome="ambiguous",
                message=f"no answer within {t.create_timeout_s:g}s after the create was sent",
            )
        except httpx.HTTPError as exc:
            return CreateVerdict(
                outcome="ambiguous",
                message=f"the connection failed after the create was sent ({self._why(exc)})",
            )
        return classify_create(response.status_code, response.content)

    async def reconcile(self, kind: Kind, external_task_id: str) -> CreateVerdict:
        """What became of an ambiguous create, asked of Kling by our external id.

        - Kling has the task → `created` with its task id (record it; never create again).
        - Kling has no such task → `retry`, never `refused`: the lost create may still be in
          flight inside Kling and become a task after this answer, so the job must not move to
          another provider (two charges). Sending the SAME body again is safe: its
          external_task_id is unique per account, so whichever copy lands second makes no task
          (its refusal is ambiguous, and the next reconcile finds the first one). Callers bound
          the loop and call this only after the create's own timeout has passed.
        - no clear answer → `ambiguous` still: reconcile again later.
        No create is sent here, so the verdict's `sent_at` stays empty.
        """
        try:
            task = await self.query_external(kind, external_task_id)
        except KlingError as exc:
            return CreateVerdict(
                outcome="ambiguous",
                code=exc.code,
                message=f"could not ask Kling about external_task_id {external_task_id}: {exc}",
            )
        if task is None:
            return CreateVerdict(
                outcome="retry",
                message=f"Kling has no task with external_task_id {external_task_id}: send the "
                "same create again (Kling will not make a second task for that id)",
            )
        return CreateVerdict(
            outcome="created",
            task_id=task.task_id,
            message=f"Kling has task {task.task_id} for external_task_id {external_task_id} "
            f"({task.status})",
        )

    # --- queries: free -----------------------------------------------------------------------

    async def query(self, kind: Kind, task_id: str) -> KlingTask:
        """GET /v1/videos/{kind}/{task_id}. Raises KlingError (not_found included)."""
        answer = await self._get_task(kind, task_id)
        if isinstance(answer, QueryProblem):
            raise self._error(f"querying Kling task {task_id}", answer)
        return answer

    async def query_external(self, kind: Kind, external_task_id: str) -> KlingTask | None:
        """The task created with this external_task_id, or None when Kling has none."""
        # Kling's API reference, "Query Task (Single)": GET /v1/videos/{kind}/{id} where the
        # path id is either task_id or external_task_id ("choose one of the two query methods")
        # (app.klingai.com/global/dev/document-api/apiReference/model/textToVideo, as copied by
        # docs.kkiai.com/Other-Model-APIs/kling-platform-api/text-to-video/query-task-single).
        if not external_task_id.strip():
            raise ValueError("an empty external_task_id names no task")
        answer = await self._get_task(kind, external_task_id)
        if isinstance(answer, QueryProblem):
            if answer.not_found:
                return None
            raise self._error(f"querying external_task_id {external_task_id}", answer)
        # One path takes both kinds of id: make sure Kling matched ours, not a task id.
        if answer.external_task_id not in (None, external_task_id):
            raise KlingError(
                f"Kling answered external_task_id {external_task_id} with task "
                f"{answer.task_id} of another external id",
                retryable=False,
            )
        return answer

    async def _get_task(self, kind: Kind, some_id: str) -> KlingTask | QueryProblem:
        t = self._timing
        timeout = httpx.Timeout(t.request_timeout_s, connect=t.connect_timeout_s)
        url = f"{self._base}/v1/videos/{kind}/{quote(some_id, safe='')}"
        for _ in range(2):  # a second try only after "token expired", with a fresh token
            try:
                async with asyncio.timeout(t.connect_timeout_s + t.request_timeout_s * 2):
                    response = await self._http.get(url, headers=self._auth(), timeout=timeout)
            except (httpx.HTTPError, TimeoutError) as exc:
                raise KlingError(f"Kling query got no answer ({self._why(exc)})") from None
            answer = read_query(response.status_code, response.content)
            if not (isinstance(answer, QueryProblem) and answer.code == TOKEN_EXPIRED):
                break
        return answer

    # --- the video: on a CDN, no key ---------------------------------------------------------

    @asynccontextmanager
    async def stream_video(self, url: str) -> AsyncIterator[httpx.Response]:
        """The finished video as a streaming response (status checked). The request carries no
        Authorization header, even if the shared client has one by default."""
        t = self._timing
        request = self._http.build_request(
            "GET", url, timeout=httpx.Timeout(t.request_timeout_s, connect=t.connect_timeout_s)
        )
        request.headers.pop("Authorization", None)
        host = urlsplit(url).hostname or "?"  # never the query string: signed URLs hold tokens
        try:
            response = await self._http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise KlingError(f"Kling video host {host} unreachable ({self._why(exc)})") from None
        try:
            if not response.is_success:
                raise KlingError(
                    f"Kling video host {host} answered HTTP {response.status_code}",
                    http_status=response.status_code,
                    # Kling deletes videos after 30 days: a 404/410 will not heal.
                    retryable=response.status_code not in (404, 410),
                )
            yield response
        finally:
            await response.aclose()

    # --- shared ------------------------------------------------------------------------------

    def _auth(self) -> dict[str, str]:
        token = sign_jwt(self._access_key, self._secret_key, int(self._clock()))
        return {"Authorization": f"Bearer {token}"}

    def _error(self, what: str, problem: QueryProblem) -> KlingError:
        return KlingError(
            self.clean(f"{what}: {problem.message}"),
            code=problem.code,
            http_status=problem.http_status,
            retryable=problem.retryable and not problem.not_found,
        )

    def _why(self, exc: BaseException) -> str:
        text = str(exc).strip()
        return self.clean(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)

    def clean(self, text: str) -> str:
        """A server's text or an exception's message, never with a key or a token in it."""
        text = _JWT.sub("[KLING_JWT]", text)
        # A key too short to be real would garble every message it happens to occur in.
        for key, name in ((self._secret_key, "SECRET"), (self._access_key, "ACCESS")):
            if len(key) >= 6:
                text = text.replace(key, f"[KLING_{name}_KEY]")
        return text if len(text) <= 300 else text[:297] + "..."
