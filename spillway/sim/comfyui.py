"""A ComfyUI double that answers like the real ComfyUI 0.3.64 server recorded in
tests/comfyui_transcripts/ (same status codes, shapes, content types, empty bodies, WebSocket
message order), used by the tests and by `spillway dev --simulate`.

HTTP: POST/GET /prompt (with "front"), GET /queue, POST /queue {"delete"|"clear"},
GET /history[/{id}], POST /history, POST /interrupt, GET /view, POST /upload/image (the input
folder), GET /object_info[/{class}] and /models[/{folder}] (what `installed` has) and GET
/system_stats of an A40; WebSocket /ws?clientId=. Prompts run one at a time in
queue order and a prompt's messages go only to the client that submitted it; a LoadImage of a
file not uploaded fails at POST time.

Knobs: `execution_s` (whole prompt; 0 = instant; a prompt with a node input `sim_render_s`
takes that long instead, for renders of mixed lengths), `progress_steps` / `progress_nodes`,
`output_bytes`, `fail_next()` / `fail_prompt()`, `pause()` / `resume()`, `ws_silent_after`,
`lose_prompt_answers`, `hang_prompt_answers`, `lose_upload_answers`, `restart()`,
`set_vram_used_pct`, `set_queue` (inert placeholders, counted but never run), `stall_next`
(prompts that hang silently until interrupted; `interrupts` records each POST /interrupt's
prompt id), `installed` (node
classes, model files), `model_load_s` (charged before a prompt whose loaders name other model
files than the last prompt's), and the faults of SimServer. Observations:
`prompt_posts` (POST /prompt per prompt_id), `most_held` (the most prompts it held at once,
running and pending), `model_loads` (model switches), `progress_sent` (each progress message:
prompt, step, when), `hits`, `ws_withheld`, `state_of()`, `wait_until()`, `expected_sha256()`,
`inputs.files` (uploaded images by "<subfolder>/<name>").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections import Counter
from typing import Any, Literal

from aiohttp import web

from spillway.sim import comfyui_graph as graph
from spillway.sim.comfyui_files import InputFolder, content_sha256, file_key, view
from spillway.sim.comfyui_run import Failure, PromptRun
from spillway.sim.server import SimServer, json_body

# An A40 as ComfyUI reports it: 48 GB card, ~45 GiB visible to torch.
A40_NAME = "cuda:0 NVIDIA A40 : cudaMallocAsync"
A40_VRAM_TOTAL = 45 * 1024**3

# aiohttp's answer to an unhandled exception: what ComfyUI sends for a body that is not JSON.
INTERNAL_ERROR = "500 Internal Server Error\n\nServer got itself in trouble"

PromptState = Literal["pending", "running", "done", "unknown"]


class ComfyUISim(SimServer):
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host, port)
        self.vram_total = A40_VRAM_TOTAL
        self.vram_free = A40_VRAM_TOTAL
        # Items as ComfyUI lists them: [number, prompt_id, prompt, extra_data, outputs_to_execute]
        self.queue_running: list[list[Any]] = []
        self.queue_pending: list[list[Any]] = []
        self.history: dict[str, dict[str, Any]] = {}
        self.execution_s = 3.0
        self.progress_steps = 10
        self.progress_nodes = {n for n, c in graph.NODE_CLASSES.items() if c.progress}
        self.output_bytes = 512
        self.ws_silent_after: int | None = None  # frames per socket before it goes silent
        self.ws_withheld = 0  # frames a silent socket did not deliver
        self.lose_prompt_answers = 0  # POST /prompt queued, then the connection dropped unanswered
        self.hang_prompt_answers = 0  # POST /prompt queued, then no answer until stop()
        self.lose_upload_answers = 0  # POST /upload/image stored, then the connection dropped
        self.prompt_posts: Counter[str] = Counter()
        self.most_held = 0
        # Generated output files, key -> size; like files on disk they survive restart().
        self.files: dict[str, int] = {}
        self.inputs = InputFolder()  # uploaded images; they survive restart() too
        # Its node classes and model files (`GET /object_info`, `/models`): replace it, then
        # restart(), as installing a custom node or a model file on a real host goes.
        self.installed = graph.Host()
        # A switch of model files costs what loading them from disk into VRAM does (seconds to
        # a minute for a 14B video model); the files of the last prompt stay loaded.
        self.model_load_s = 0.0
        # The next this many prompts hang in their first node, silent, until interrupted (a
        # node that never returns); `interrupts`: the prompt id each POST /interrupt named.
        self.stall_next = 0
        self.progress_sent: list[tuple[str, int, float]] = []  # (prompt, step, time.time())
        self.interrupts: list[str | None] = []
        self.model_loads = 0
        self.loaded: frozenset[str] = frozenset()
        self._counters: dict[tuple[str, str], int] = {}
        self._number = 0
        self._inert: set[str] = set()
        self._fail_next: Failure | None = None
        self._fail_ids: dict[str, Failure] = {}
        self._sockets: dict[str, web.WebSocketResponse] = {}
        self._sent: Counter[int] = Counter()
        self._interrupt = False
        self._run: PromptRun | None = None
        self._changed = asyncio.Event()
        self._tick = asyncio.Event()
        self._unpaused = asyncio.Event()
        self._unpaused.set()
        self._executor: asyncio.Task[None] | None = None

    # --- knobs ---------------------------------------------------------------------------

    def set_vram_used_pct(self, pct: float) -> None:
        self.vram_free = round(self.vram_total * (1 - pct / 100))

    def set_queue(self, running: int = 0, pending: int = 0) -> None:
        """Fill the queue with placeholder prompts (not executed; only their count matters)."""
        self.queue_running = [self._placeholder("running") for _ in range(running)]
        self.queue_pending = [self._placeholder("pending") for _ in range(pending)]

    def _placeholder(self, kind: str) -> list[Any]:
        self._number += 1
        prompt_id = f"sim-{kind}-{self._number}"
        self._inert.add(prompt_id)
        graph_ = {"1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64}}}
        return [self._number, prompt_id, graph_, {"client_id": "sim"}, ["1"]]

    def fail_next(self, failure: Failure | None = None) -> None:
        """The next prompt to start ends in execution_error."""
        self._fail_next = failure or Failure()

    def fail_prompt(self, prompt_id: str, failure: Failure | None = None) -> None:
        self._fail_ids[prompt_id] = failure or Failure()

    def pause(self) -> None:
        """Start no further prompt (the running one finishes): queued prompts stay pending."""
        self._unpaused.clear()

    def resume(self) -> None:
        self._unpaused.set()
        self._changed.set()

    async def restart(self, down_s: float = 0.0) -> None:
        """What a ComfyUI restart does: sockets close, queue and history (in memory) are gone,
        the running prompt is lost; output files on disk and the port stay."""
        await self.stop()
        await self._stop_executor()
        self.queue_running, self.queue_pending, self.history = [], [], {}
        self._inert.clear()
        self._number = 0
        self.loaded = frozenset()
        self._touch()
        await asyncio.sleep(down_s)
        await self.start()

    # --- observations --------------------------------------------------------------------

    def state_of(self, prompt_id: str) -> PromptState:
        if any(item[1] == prompt_id for item in self.queue_running):
            return "running"
        if any(item[1] == prompt_id for item in self.queue_pending):
            return "pending"
        return "done" if prompt_id in self.history else "unknown"

    async def wait_until(self, prompt_id: str, state: PromptState, within_s: float = 10.0) -> None:
        async with asyncio.timeout(within_s):
            while self.state_of(prompt_id) != state:
                await self._tick.wait()

    def _touch(self) -> None:
        self._tick.set()
        self._tick = asyncio.Event()

    def expected_sha256(self, filename: str, subfolder: str = "", kind: str = "output") -> str:
        key = file_key(kind, subfolder, filename)
        return content_sha256(key, self.files[key])

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> ComfyUISim:
        await super().start()
        if self._executor is None:
            self._executor = asyncio.create_task(self._execute_forever())
        return self

    async def stop(self) -> None:
        for ws in list(self._sockets.values()):
            await ws.close()
        await super().stop()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
        await self._stop_executor()

    async def _stop_executor(self) -> None:
        if self._executor is not None:
            task, self._executor = self._executor, None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._run = None

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/system_stats", self._system_stats)
        app.router.add_get("/queue", self._queue)
        app.router.add_post("/queue", self._post_queue)
        app.router.add_get("/prompt", self._prompt_info)
        app.router.add_post("/prompt", self._post_prompt)
        app.router.add_get("/history", self._history_all)
        app.router.add_get("/history/{prompt_id}", self._history_one)
        app.router.add_post("/history", self._post_history)
        app.router.add_post("/interrupt", self._post_interrupt)
        app.router.add_get("/view", self._view)
        app.router.add_post("/upload/image", self._upload_image)
        app.router.add_get("/ws", self._ws)
        app.router.add_get("/object_info", self._object_info)
        app.router.add_get("/object_info/{node_class}", self._object_info_one)
        app.router.add_get("/models", self._model_folders)
        app.router.add_get("/models/{folder}", self._model_files)
        app.router.add_post("/sim/gpu", self._sim_gpu)

    # --- HTTP ----------------------------------------------------------------------------

    async def _sim_gpu(self, request: web.Request) -> web.Response:
        """Not ComfyUI's: how `spillway sim gpu` flips a running double between free and busy."""
        body = await json_body(request)
        if isinstance(body, dict) and isinstance(body.get("vram_used_pct"), int | float):
            self.set_vram_used_pct(float(body["vram_used_pct"]))
        if isinstance(body, dict) and isinstance(body.get("execution_s"), int | float):
            self.execution_s = float(body["execution_s"])
        used = (self.vram_total - self.vram_free) / self.vram_total * 100
        return web.json_response({"vram_used_pct": round(used, 1), "execution_s": self.execution_s})

    async def _object_info(self, request: web.Request) -> web.Response:
        return web.json_response(self.installed.object_info())

    async def _object_info_one(self, request: web.Request) -> web.Response:
        # An unknown class: {} (object_info_unknown_class.json).
        return web.json_response(self.installed.object_info(request.match_info["node_class"]))

    async def _model_folders(self, request: web.Request) -> web.Response:
        return web.json_response(list(graph.MODEL_FOLDERS))

    async def _model_files(self, request: web.Request) -> web.Response:
        folder = request.match_info["folder"]
        if folder not in graph.MODEL_FOLDERS:
            return web.Response(status=404)  # ComfyUI's answer for a folder it does not know
        return web.json_response(list(self.installed.models.get(folder, ())))

    async def _system_stats(self, request: web.Request) -> web.Response:
        return web.json_response(system_stats(self.port, self.vram_total, self.vram_free))

    async def _queue(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"queue_running": self.queue_running, "queue_pending": self.queue_pending}
        )

    def _queue_info(self) -> dict[str, Any]:
        remaining = len(self.queue_running) + len(self.queue_pending)
        return {"exec_info": {"queue_remaining": remaining}}

    async def _prompt_info(self, request: web.Request) -> web.Response:
        return web.json_response(self._queue_info())

    async def _post_prompt(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        if not isinstance(body, dict):
            return web.Response(status=500, text=INTERNAL_ERROR)
        # ComfyUI numbers every POST, rejected ones included; "front" queues it first.
        number: float | int = -self._number if body.get("front") else self._number
        self._number += 1
        if "number" in body:
            number = float(body["number"])
        if "prompt" not in body:
            error = graph.error_body("no_prompt", "No prompt provided", "No prompt provided")
            return web.json_response({"error": error, "node_errors": {}}, status=400)
        prompt = body["prompt"]
        prompt_id = str(body.get("prompt_id", uuid.uuid4()))
        self.prompt_posts[prompt_id] += 1
        if not isinstance(prompt, dict):
            return web.Response(status=500, text=INTERNAL_ERROR)
        result = graph.validate(prompt, self.inputs.exists, self.installed)
        if not result.ok:
            return web.json_response(
                {"error": result.error, "node_errors": result.node_errors}, status=400
            )
        extra = dict(body.get("extra_data") or {})
        if "client_id" in body:
            extra["client_id"] = body["client_id"]
        self.queue_pending.append([number, prompt_id, prompt, extra, result.outputs])
        self.queue_pending.sort(key=lambda item: item[0])
        held = len(self.queue_running) + len(self.queue_pending)
        self.most_held = max(self.most_held, held)
        self._changed.set()
        self._touch()
        await self._broadcast("status", {"status": self._queue_info()})
        if self.lose_prompt_answers > 0:  # the ambiguous failure: queued, but no answer
            self.lose_prompt_answers -= 1
            assert request.transport is not None
            request.transport.close()
        if self.hang_prompt_answers > 0:  # queued; the caller waits (and may die) meanwhile
            self.hang_prompt_answers -= 1
            await self._release.wait()
        return web.json_response(
            {"prompt_id": prompt_id, "number": number, "node_errors": result.node_errors}
        )

    async def _post_queue(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        if not isinstance(body, dict):
            return web.Response(status=500, text=INTERNAL_ERROR)
        if body.get("clear"):
            self.queue_pending = []
        for prompt_id in body.get("delete", []):
            # Only pending items: a running prompt is stopped by /interrupt, never deleted.
            self.queue_pending = [i for i in self.queue_pending if i[1] != prompt_id]
        self._touch()
        await self._broadcast("status", {"status": self._queue_info()})
        return web.Response(status=200)

    async def _history_all(self, request: web.Request) -> web.Response:
        items = list(self.history.items())
        max_items = request.rel_url.query.get("max_items")
        if max_items is not None and max_items.isdigit():
            items = items[-int(max_items) :] if int(max_items) else []
        return web.json_response(dict(items))

    async def _history_one(self, request: web.Request) -> web.Response:
        prompt_id = request.match_info["prompt_id"]
        entry = self.history.get(prompt_id)
        return web.json_response({} if entry is None else {prompt_id: entry})

    async def _post_history(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        if isinstance(body, dict):
            if body.get("clear"):
                self.history = {}
            for prompt_id in body.get("delete", []):
                self.history.pop(prompt_id, None)
            self._touch()
        return web.Response(status=200)

    async def _post_interrupt(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        prompt_id = body.get("prompt_id") if isinstance(body, dict) else None
        self.interrupts.append(prompt_id)
        # With a prompt_id ComfyUI interrupts only if that prompt is the one running.
        if not prompt_id or any(i[1] == prompt_id for i in self.queue_running):
            self._interrupt = True
        return web.Response(status=200)

    async def _view(self, request: web.Request) -> web.StreamResponse:
        return await view(request, self.files, self.inputs)

    async def _upload_image(self, request: web.Request) -> web.Response:
        response = await self.inputs.upload(request)
        if self.lose_upload_answers > 0 and response.status == 200:
            self.lose_upload_answers -= 1
            assert request.transport is not None
            request.transport.close()
        return response

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
            if kind == "progress":
                self.progress_sent.append((prompt_id, data["value"], time.time()))
            await self._send(client_id, kind, data)

        self._run = run = PromptRun(
            item,
            send,
            lambda: self._interrupt,
            failure,
            execution_s=_render_s(item[2], self.execution_s),
            progress_steps=self.progress_steps,
            progress_nodes=frozenset(self.progress_nodes),
            output_bytes=self.output_bytes,
            files=self.files,
            counters=self._counters,
            stall=self.stall_next > 0,
        )
        self.stall_next = max(0, self.stall_next - 1)
        await self._broadcast("status", {"status": self._queue_info()})
        models = graph.model_files(item[2])
        if models and models != self.loaded:
            self.model_loads += 1
            self.loaded = models
            await asyncio.sleep(self.model_load_s)
        entry = await run.execute()
        # One step, as ComfyUI's task_done under its mutex: never in both, never in neither.
        self.queue_running.remove(item)
        self.history[prompt_id] = entry
        self._run = None
        self._touch()
        await self._broadcast("status", {"status": self._queue_info()})
        await send("executing", {"node": None, "prompt_id": prompt_id})


def _render_s(prompt: dict[str, Any], default: float) -> float:
    """The prompt's length on the double: a node input `sim_render_s` (ComfyUI ignores inputs
    a node does not declare), else `default`."""
    for node in prompt.values():
        seconds = node.get("inputs", {}).get("sim_render_s") if isinstance(node, dict) else None
        if isinstance(seconds, int | float) and not isinstance(seconds, bool) and seconds >= 0:
            return float(seconds)
    return default


def system_stats(port: int, vram_total: int, vram_free: int) -> dict[str, Any]:
    """GET /system_stats as ComfyUI answered it on an A40 (system_stats.json)."""
    return {
        "system": {
            "os": "posix",
            "ram_total": 67_280_302_080,
            "ram_free": 51_539_607_552,
            "comfyui_version": "0.3.64",
            "required_frontend_version": "1.27.10",
            "installed_templates_version": "0.1.95",
            "required_templates_version": "0.1.95",
            "python_version": "3.11.7",
            "pytorch_version": "2.14.1+cu130",
            "embedded_python": False,
            "argv": ["main.py", "--listen", "127.0.0.1", "--port", str(port)],
        },
        "devices": [
            {
                "name": A40_NAME,
                "type": "cuda",
                "index": 0,
                "vram_total": vram_total,
                "vram_free": vram_free,
                "torch_vram_total": vram_total,
                "torch_vram_free": vram_free,
            }
        ],
    }
