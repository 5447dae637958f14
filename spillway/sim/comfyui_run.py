"""One execution of a queued prompt in the ComfyUI double, message by message in ComfyUI
0.3.64's order, ending in the history entry ComfyUI writes (recorded in
tests/comfyui_transcripts/: ws_success_sequence.json, ws_error_tail.json,
ws_interrupted_tail.json, history_*.json); and `Failure`, how a test makes a run end in
execution_error.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from spillway.sim.comfyui_files import file_key
from spillway.sim.comfyui_graph import NODE_CLASSES, execution_order, output_files

STALL_LOOK_S = 0.05  # how often a hung node looks for an interrupt

# The runtime failure recorded in history_execution_error.json.
DEFAULT_EXCEPTION = (
    "av.error.ExternalError",
    "[Errno 542398533] Generic error in an external library: 'avcodec_open2(\"libx264\", {})'\n",
)


@dataclass(frozen=True)
class Failure:
    """How a prompt ends in execution_error: at `node_id` (default: its last node)."""

    message: str = DEFAULT_EXCEPTION[1]
    exception_type: str = DEFAULT_EXCEPTION[0]
    node_id: str | None = None


Send = Callable[[str, dict[str, Any]], Awaitable[None]]


class _Ended(Exception):
    pass


class PromptRun:
    """One execution of a queued prompt, message by message in ComfyUI 0.3.64's order
    (ws_success_sequence.json): execution_start, execution_cached, then per node progress_state,
    executing, [progress], [executed], progress_state; then execution_success | execution_error |
    execution_interrupted. `execute` returns the history entry."""

    def __init__(
        self,
        item: list[Any],
        send: Send,
        interrupted: Callable[[], bool],
        failure: Failure | None,
        *,
        execution_s: float,
        progress_steps: int,
        progress_nodes: frozenset[str],
        output_bytes: int,
        files: dict[str, int],
        counters: dict[tuple[str, str], int],
        stall: bool = False,
    ) -> None:
        self.item, self._send, self._interrupted, self._failure = item, send, interrupted, failure
        self.prompt_id: str = item[1]
        self.client_id: str | None = item[3].get("client_id")
        self.prompt: dict[str, Any] = item[2]
        self.node: str | None = None
        self._execution_s, self._steps = execution_s, progress_steps
        self._progress_nodes, self._output_bytes = progress_nodes, output_bytes
        self._files, self._counters = files, counters
        self._stall = stall  # hang in the first node, silent, until interrupted
        self._messages: list[list[Any]] = []
        self._states: dict[str, dict[str, Any]] = {}
        self._executed: list[str] = []
        self._outputs: dict[str, Any] = {}

    async def execute(self) -> dict[str, Any]:
        await self._message("execution_start", {"prompt_id": self.prompt_id}, record=True)
        await self._message("execution_cached", {"nodes": [], "prompt_id": self.prompt_id}, True)
        order = execution_order(self.prompt, self.item[4])
        fail_at = None
        if self._failure is not None:
            fail_at = self._failure.node_id if self._failure.node_id in order else order[-1]
        try:
            for node_id in order:
                await self._run_node(node_id, self._execution_s / len(order), node_id == fail_at)
            await self._message("execution_success", {"prompt_id": self.prompt_id}, record=True)
            status = "success"
        except _Ended:
            status = "error"
        return {
            "prompt": self.item,
            "outputs": self._outputs,
            "status": {
                "status_str": status,
                "completed": status == "success",
                "messages": self._messages,
            },
            "meta": {
                n: {"node_id": n, "display_node": n, "parent_node": None, "real_node_id": n}
                for n in self._outputs
            },
        }

    async def _run_node(self, node_id: str, seconds: float, fail: bool) -> None:
        class_type = self.prompt[node_id]["class_type"]
        self.node = node_id
        await self._progress_state(node_id, 0, 1, "running")
        executing = {"node": node_id, "display_node": node_id, "prompt_id": self.prompt_id}
        await self._message("executing", executing)
        # ComfyUI checks for an interrupt before each node, and samplers at every step.
        if self._interrupted():
            await self._end("execution_interrupted", node_id, class_type)
        while self._stall:
            await asyncio.sleep(STALL_LOOK_S)
            if self._interrupted():
                await self._end("execution_interrupted", node_id, class_type)
        if class_type in self._progress_nodes and self._steps > 0:
            for step in range(1, self._steps + 1):
                await asyncio.sleep(seconds / self._steps)
                if self._interrupted():
                    await self._end("execution_interrupted", node_id, class_type)
                await self._progress_state(node_id, step, self._steps, "running")
                progress = {"value": step, "max": self._steps, "prompt_id": self.prompt_id}
                await self._message("progress", progress | {"node": node_id})
        else:
            await asyncio.sleep(seconds)
        if fail:
            await self._end("execution_error", node_id, class_type, self._failure)
        if NODE_CLASSES[class_type].output is not None:
            ui, files = output_files(self.prompt, node_id, self._counters)
            for kind, subfolder, filename in files:
                self._files[file_key(kind, subfolder, filename)] = self._output_bytes
            self._outputs[node_id] = ui
            executed = {"node": node_id, "display_node": node_id, "output": ui}
            await self._message("executed", executed | {"prompt_id": self.prompt_id})
        self._executed.insert(0, node_id)
        await self._progress_state(node_id, 1, 1, "finished")

    async def _end(
        self, kind: str, node_id: str, class_type: str, failure: Failure | None = None
    ) -> None:
        data: dict[str, Any] = {
            "prompt_id": self.prompt_id,
            "node_id": node_id,
            "node_type": class_type,
            "executed": list(self._executed),
        }
        if failure is not None:
            data |= {
                "exception_message": failure.message,
                "exception_type": failure.exception_type,
                "traceback": ['  File "<comfyui>/execution.py", line 496, in execute\n'],
                "current_inputs": {},
                "current_outputs": [node_id, *self._executed],
            }
        await self._message(kind, data, record=True)
        raise _Ended()

    async def _progress_state(self, node_id: str, value: int, maximum: int, state: str) -> None:
        self._states[node_id] = {
            "value": float(value),
            "max": float(maximum),
            "state": state,
            "node_id": node_id,
            "prompt_id": self.prompt_id,
            "display_node_id": node_id,
            "parent_node_id": None,
            "real_node_id": node_id,
        }
        nodes = {n: dict(s) for n, s in self._states.items()}
        await self._message("progress_state", {"prompt_id": self.prompt_id, "nodes": nodes})

    async def _message(self, kind: str, data: dict[str, Any], record: bool = False) -> None:
        if record:  # history keeps execution_start/cached/success/error/interrupted
            data = data | {"timestamp": int(time.time() * 1000)}
            self._messages.append([kind, data])
        await self._send(kind, data)
