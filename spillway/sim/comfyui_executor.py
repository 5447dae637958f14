"""The half of the ComfyUI double (spillway/sim/comfyui.py) that runs prompts and sends their
messages: WebSocket /ws?clientId= and the executor, which runs prompts one at a time in queue
order (each run: spillway/sim/comfyui_run.py) and sends a prompt's messages to the client that
submitted it, in ComfyUI 0.3.64's order (tests/comfyui_transcripts/).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

from aiohttp import web

from spillway.sim.comfyui_failure import Failure
from spillway.sim.comfyui_run import PromptRun


class PromptExecutor:
    """A mixin of ComfyUISim, whose __init__ sets the state below (its knobs and queue)."""

    queue_running: list[list[Any]]
    queue_pending: list[list[Any]]
    history: dict[str, dict[str, Any]]
    execution_s: float
    progress_steps: int
    progress_nodes: set[str]
    output_bytes: int
    ws_silent_after: int | None
    ws_withheld: int
    files: dict[str, int]
    _counters: dict[tuple[str, str], int]
    _inert: set[str]
    _fail_next: Failure | None
    _fail_ids: dict[str, Failure]
    _sockets: dict[str, web.WebSocketResponse]
    _sent: Counter[int]
    _interrupt: bool
    _run: PromptRun | None
    _changed: asyncio.Event
    _unpaused: asyncio.Event
    _executor: asyncio.Task[None] | None
    _touch: Callable[[], None]
    _queue_info: Callable[[], dict[str, Any]]

    async def _stop_executor(self) -> None:
        if self._executor is not None:
            task, self._executor = self._executor, None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._run = None

    # --- WebSocket -----------------------------------------------------------------------

    async def _ws(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(timeout=1.0)  # a restart must not wait on a silent client
        await ws.prepare(request)
        sid = request.rel_url.query.get("clientId", "") or uuid.uuid4().hex
        self._sockets[sid] = ws  # a reconnect with the same clientId replaces the old socket
        try:
            await self._send(sid, "status", {"status": self._queue_info(), "sid": sid})
            run = self._run
            if run is not None and run.client_id == sid and run.node is not None:
                await self._send(sid, "executing", {"node": run.node})
            async for _ in ws:
                pass  # feature flags and the like: nothing to answer
        finally:
            # ComfyUI pops by clientId: an old socket closing after a reconnect unregisters the
            # new one too, which then hears nothing (the history poll covers that).
            self._sockets.pop(sid, None)
            self._sent.pop(id(ws), None)
        return ws

    async def _send(self, sid: str | None, kind: str, data: dict[str, Any]) -> None:
        ws = self._sockets.get(sid) if sid is not None else None
        if ws is None or ws.closed:
            return
        if self.ws_silent_after is not None and self._sent[id(ws)] >= self.ws_silent_after:
            self.ws_withheld += 1  # a stalled socket: open, but nothing arrives
            return
        self._sent[id(ws)] += 1
        with contextlib.suppress(ConnectionError, RuntimeError):
            await ws.send_str(json.dumps({"type": kind, "data": data}))

    async def _broadcast(self, kind: str, data: dict[str, Any]) -> None:
        for sid in list(self._sockets):
            await self._send(sid, kind, data)

    # --- execution -----------------------------------------------------------------------

    async def _execute_forever(self) -> None:
        while True:
            await self._unpaused.wait()
            item = next((i for i in self.queue_pending if i[1] not in self._inert), None)
            if item is None:
                self._changed.clear()
                await self._changed.wait()
                continue
            await self._execute(item)

    async def _execute(self, item: list[Any]) -> None:
        prompt_id, client_id = item[1], item[3].get("client_id")
        self.queue_pending.remove(item)
        self.queue_running.append(item)
        self._interrupt = False  # ComfyUI clears the flag when a prompt starts
        self._touch()
        failure = self._fail_ids.pop(prompt_id, None) or self._fail_next
        self._fail_next = None

        async def send(kind: str, data: dict[str, Any]) -> None:
            await self._send(client_id, kind, data)

        self._run = run = PromptRun(
            item,
            send,
            lambda: self._interrupt,
            failure,
            execution_s=self.execution_s,
            progress_steps=self.progress_steps,
            progress_nodes=frozenset(self.progress_nodes),
            output_bytes=self.output_bytes,
            files=self.files,
            counters=self._counters,
        )
        await self._broadcast("status", {"status": self._queue_info()})
        entry = await run.execute()
        # One step, as ComfyUI's task_done under its mutex: never in both, never in neither.
        self.queue_running.remove(item)
        self.history[prompt_id] = entry
        self._run = None
        self._touch()
        await self._broadcast("status", {"status": self._queue_info()})
        await send("executing", {"node": None, "prompt_id": prompt_id})
