"""A ComfyUI double that answers like the real ComfyUI 0.3.64 server recorded in
shared/comfyui-transcripts (same shapes, same content types).

This part serves what the load probe reads: `/system_stats` (VRAM) and `/queue` (backlog), plus
`GET /prompt`. Knobs: `set_vram_used_pct`, `set_queue`, and the faults of SimServer.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from spillway.sim.server import SimServer

# An A40 as ComfyUI reports it: 48 GB card, ~45 GiB visible to torch.
A40_NAME = "cuda:0 NVIDIA A40 : cudaMallocAsync"
A40_VRAM_TOTAL = 45 * 1024**3


class ComfyUISim(SimServer):
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host, port)
        self.vram_total = A40_VRAM_TOTAL
        self.vram_free = A40_VRAM_TOTAL
        # Items as ComfyUI lists them: [number, prompt_id, prompt, extra_data, outputs_to_execute]
        self.queue_running: list[list[Any]] = []
        self.queue_pending: list[list[Any]] = []
        self._number = 0

    def set_vram_used_pct(self, pct: float) -> None:
        self.vram_free = round(self.vram_total * (1 - pct / 100))

    def set_queue(self, running: int = 0, pending: int = 0) -> None:
        """Fill the queue with placeholder prompts (not executed; only their count matters)."""
        self.queue_running = [self._placeholder("running") for _ in range(running)]
        self.queue_pending = [self._placeholder("pending") for _ in range(pending)]

    def _placeholder(self, kind: str) -> list[Any]:
        self._number += 1
        graph = {"1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64}}}
        return [self._number, f"sim-{kind}-{self._number}", graph, {"client_id": "sim"}, ["1"]]

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/system_stats", self._system_stats)
        app.router.add_get("/queue", self._queue)
        app.router.add_get("/prompt", self._prompt_info)

    async def _system_stats(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "system": {
                    "os": "posix",
                    "ram_total": 67_280_302_080,
                    "ram_free": 51_539_607_552,
                    "comfyui_version": "0.3.64",
                    "required_frontend_version": "1.27.10",
                    "python_version": "3.11.7",
                    "pytorch_version": "2.14.1+cu130",
                    "embedded_python": False,
                    "argv": ["main.py", "--listen", "127.0.0.1", "--port", str(self.port)],
                },
                "devices": [
                    {
                        "name": A40_NAME,
                        "type": "cuda",
                        "index": 0,
                        "vram_total": self.vram_total,
                        "vram_free": self.vram_free,
                        "torch_vram_total": self.vram_total,
                        "torch_vram_free": self.vram_free,
                    }
                ],
            }
        )

    async def _queue(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"queue_running": self.queue_running, "queue_pending": self.queue_pending}
        )

    async def _prompt_info(self, request: web.Request) -> web.Response:
        remaining = len(self.queue_running) + len(self.queue_pending)
        return web.json_response({"exec_info": {"queue_remaining": remaining}})
