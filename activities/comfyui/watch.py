"""One WebSocket and one poll loop per agent and ComfyUI, shared by every wait on that ComfyUI
(docs/design.md, "GPU hosts and agents" and "ComfyUI facts").

A thousand jobs waiting on one busy GPU must cost one socket and about one `GET /queue` per
COMFYUI_HISTORY_POLL_S, not a thousand of each. Each `comfyui_wait` registers its prompt here
(`follow`) and reads what the watcher learns about it, progress and then the end, from a queue
of its own. A new wait costs one `GET /history/{id}`, at once: its prompt may be over already,
the socket having told its end before anyone followed it. While HISTORY_READS looks are pending a
new wait gets none and the next round reads for it, so a thousand waits following at once (an
agent restarting) read a few histories that way, not a thousand.

- The socket, `/ws?clientId=<the agent's client id>`: ComfyUI sends a prompt's messages only to
  the client that submitted it, so `comfyui_submit` posts under this same id. Messages go to the
  waits of the prompt they name; the prompt-less `executing` ComfyUI sends after a reconnect goes
  to the prompt running. An end message makes the watcher read that prompt's history at once.
- The poll, one round per interval (and one soon after new waits arrive, at most five an
  interval): `GET /queue` once, then `GET /history/{id}` only for the prompts no longer queued,
  a few at a time. Only the rounds decide that a prompt is LOST: `{}` in /history and not in
  /queue, twice, a full interval apart; a look outside them (the socket's, a new wait's) only
  finds an end.
- A stalled or dropped socket (it reconnects) costs progress and speed, never an outcome.
- A round whose `GET /queue` gets no answer tells every wait `Silent(since)`, so a host that went
  away mid-render is noticed (each wait decides when to say so); the first answered round after
  it tells the waits that asked (`follow(..., answers=True)`) `Silent(None)`.

The watcher's tasks run outside every activity's context, so they never heartbeat: each wait
heartbeats what it reads, from its own task (heartbeating from here would reach whichever
activity happened to start the watcher).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
import uuid
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any

from activities.comfyui.answers import Queued, socket_news, socket_prompt
from activities.comfyui.client import ComfyUIClient, Unavailable
from spillway.core.models import Progress

_log = logging.getLogger(__name__)
HISTORY_READS = 8  # history requests at once, e.g. after a restart emptied the queue


@dataclass(frozen=True)
class Ended:
    """How a prompt ended: its history entry, or None when it is LOST."""

    entry: dict[str, Any] | None


@dataclass(frozen=True)
class Silent:
    """ComfyUI did not answer the poll since `since` (time.time() when the first unanswered round
    began); None: it answers again."""

    since: float | None


News = Progress | Ended | Silent


class Following:
    """One wait's view of its prompt: `await next()` gives Progress and Silent news, then one
    Ended. `answers`: also told Silent(None) at the next answered round (once)."""

    def __init__(self, prompt_id: str, *, answers: bool = False) -> None:
        self.prompt_id = prompt_id
        self.answers = answers
        self._news: asyncio.Queue[News | None] = asyncio.Queue()

    def tell(self, news: News | None) -> None:
        self._news.put_nowait(news)

    async def next(self) -> News:
        news = await self._news.get()
        if news is None:
            raise Unavailable("the agent stopped watching ComfyUI (shutting down)")
        return news


@dataclass(eq=False)
class _Watched:
    followers: set[Following] = field(default_factory=set)
    where: Queued | None = None  # last seen in the queue
    absent_since: float | None = None  # loop time of the first "neither queued nor in history"
    ended: bool = False

    def tell(self, news: News | None) -> None:
        for following in self.followers:
            following.tell(news)


def _place(where: Queued) -> Progress:
    return Progress(phase="queued" if where == "pending" else "running")


class ComfyUIWatcher:
    """Started on first use (`start`, or `follow`); `aclose` stops it and ends every wait still
    following with a retryable Unavailable."""

    def __init__(self, client: ComfyUIClient, poll_s: float, *, client_id: str | None = None):
        # One id per agent process: ComfyUI keeps one socket per client id, so two agents
        # sharing an id would take each other's socket.
        self.client_id = client_id or f"spillway-agent-{uuid.uuid4().hex[:12]}"
        self._client, self._poll_s = client, poll_s
        self._watched: dict[str, _Watched] = {}
        self._loops: list[asyncio.Task[None]] = []
        self._looks: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._reads = asyncio.Semaphore(HISTORY_READS)
        self._running: str | None = None  # the prompt ComfyUI runs, as far as we know
        self._last_round = float("-inf")  # when the last round began
        self._round_ended = float("-inf")
        self._silent_since: float | None = None
        # When the socket last (re)connected (time.time()): ComfyUI greets every connection with
        # a `status` naming its sid. After a restart, what ComfyUI can run may have changed.
        self.connected_at = float("-inf")

    def start(self) -> None:
        if not self._loops:
            self._loops = [self._spawn(self._listen_forever()), self._spawn(self._poll_forever())]

    @contextlib.asynccontextmanager
    async def follow(self, prompt_id: str, *, answers: bool = False) -> AsyncIterator[Following]:
        self.start()
        following = Following(prompt_id, answers=answers)
        watched = self._watched.get(prompt_id)
        if watched is None:
            watched = self._watched[prompt_id] = _Watched()
            # Short prompts are often over before their wait follows them (the socket's end
            # came while nobody watched), and the next round may be a fifth of an interval away.
            if len(self._looks) < HISTORY_READS:  # beyond that, the round reads for them
                self._look_now(prompt_id, watched)
        watched.followers.add(following)
        if watched.where is not None:
            following.tell(_place(watched.where))
        # A round soon all the same: it says where a prompt still queued is, and a silence is
        # told only from a round this wait saw (an idle watcher's last round may be long past).
        self._wake.set()
        try:
            yield following
        finally:
            watched.followers.discard(following)
            if not watched.followers and self._watched.get(prompt_id) is watched:
                del self._watched[prompt_id]

    async def aclose(self) -> None:
        tasks = [*self._loops, *self._looks]
        self._loops, self._looks = [], set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for watched in self._watched.values():
            watched.tell(None)
        self._watched.clear()

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        # An empty context: no activity's (heartbeat, logger details) leaks into shared work.
        return asyncio.create_task(work, context=contextvars.Context())

    # --- the poll --------------------------------------------------------------------------

    async def _poll_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self._watched:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._poll_s):
                        await self._wake.wait()
            else:
                await self._wake.wait()  # nobody waits: no requests at all
            # Waits that start together share a round: at most five rounds an interval.
            await asyncio.sleep(max(0.0, self._last_round + self._poll_s / 5 - loop.time()))
            self._wake.clear()
            try:
                await self._round(loop.time())
            except Exception:  # a bug here must not end every wait's watch
                _log.exception("ComfyUI poll round failed")
            finally:
                self._round_ended = loop.time()

    async def _round(self, at: float) -> None:
        watched = dict(self._watched)
        if not watched:
            return
        # Nobody watched for a while: what came between is unknown. Measured from the end of
        # the last round, not its start: a host that hangs makes each failed round last its
        # connect timeout, and the silence must keep counting through them.
        if at - self._round_ended > 2 * self._poll_s:
            self._silent_since = None
        self._last_round = at
        began = time.time()
        try:
            places = await self._client.queue()
        except Unavailable as exc:
            # No answer is not an answer: only ComfyUI saying "neither queued nor in history"
            # counts towards LOST.
            _log.warning("polling ComfyUI for %d prompts: %s", len(watched), exc)
            if self._silent_since is None:
                self._silent_since = began
            for prompt in watched.values():
                prompt.tell(Silent(self._silent_since))
            return
        self._silent_since = None
        for prompt in watched.values():
            for following in prompt.followers:
                if following.answers:
                    following.answers = False
                    following.tell(Silent(None))
        self._running = next((p for p, w in places.items() if w == "running"), None)
        gone = []
        for prompt_id, prompt in watched.items():
            where = places.get(prompt_id)
            if where is None:
                gone.append(self._look_back(prompt_id, prompt, at))
                continue
            prompt.absent_since = None
            if where != prompt.where:
                prompt.where = where
                prompt.tell(_place(where))
        await asyncio.gather(*gone)

    async def _look_back(self, prompt_id: str, prompt: _Watched, at: float | None) -> None:
        """Reads the history of a prompt no longer queued. `at`: when this round read /queue
        (a `{}` then counts towards LOST); None for a look the socket asked for."""
        async with self._reads:
            if prompt.ended:
                return
            try:
                entry = await self._client.history(prompt_id)
            except Unavailable as exc:
                _log.warning("reading the history of prompt %s: %s", prompt_id, exc)
                return
        if entry is not None:
            self._end(prompt_id, prompt, Ended(entry))
        elif at is None or prompt.ended:
            return
        elif prompt.absent_since is None:
            prompt.absent_since = at  # a second look, a full interval later, decides
        elif at - prompt.absent_since >= self._poll_s:
            _log.warning("prompt %s is lost (ComfyUI restarted?)", prompt_id)
            self._end(prompt_id, prompt, Ended(None))

    def _look_now(self, prompt_id: str, prompt: _Watched) -> None:
        """Reads the prompt's history outside the rounds: a `{}` then never counts towards LOST."""
        look = self._spawn(self._look_back(prompt_id, prompt, None))
        self._looks.add(look)
        look.add_done_callback(self._looks.discard)

    def _end(self, prompt_id: str, prompt: _Watched, ended: Ended) -> None:
        if prompt.ended:
            return
        prompt.ended = True
        prompt.tell(ended)
        if self._watched.get(prompt_id) is prompt:
            del self._watched[prompt_id]

    # --- the socket ------------------------------------------------------------------------

    async def _listen_forever(self) -> None:
        reconnect_max_s = max(self._poll_s, 1.0)
        while True:
            try:
                async for message in self._client.socket_messages(
                    self.client_id, reconnect_max_s=reconnect_max_s
                ):
                    self._dispatch(message)
            except Exception:  # the poll carries on meanwhile
                _log.exception("ComfyUI socket failed")
                await asyncio.sleep(reconnect_max_s)

    def _dispatch(self, message: Any) -> None:
        data = message.get("data") if isinstance(message, dict) else None
        if isinstance(data, dict) and "sid" in data and message.get("type") == "status":
            self.connected_at = time.time()
        named = socket_prompt(message)
        if named is not None and isinstance(message, dict) and message["type"] == "execution_start":
            self._running = named
        prompt_id = named or self._running
        prompt = self._watched.get(prompt_id) if prompt_id is not None else None
        if prompt_id is None or prompt is None:
            return
        news = socket_news(message, prompt_id)
        if isinstance(news, Progress):
            prompt.where = "running"  # the poll need not say "running" again
            prompt.tell(news)
        elif news == "ended":
            # `executing {node: null}` comes after history is written: look now, not next round.
            self._look_now(prompt_id, prompt)
