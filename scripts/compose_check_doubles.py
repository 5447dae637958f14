"""The ComfyUI and MiniMax doubles for scripts/compose_check.sh, reachable from its containers.

`python -m spillway.sim` listens on loopback only; the compose stack's agent and workers run in
containers and reach the host at `--public-host` (podman's host.containers.internal), so these
listen on `--bind` and hand out download URLs under the public name. Every half second the
doubles' counters go to `--state` (JSON): the check reads how many prompts ComfyUI was sent and
how many videos MiniMax was asked to create. Its GPU is switched with `POST /sim/gpu` as usual.
Serves until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
from pathlib import Path

from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim


def _write(path: Path, state: dict[str, object]) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(state), encoding="utf-8")
    os.replace(partial, path)  # the reader never sees half a file


async def serve(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with (
        ComfyUISim(host=args.bind, port=args.comfyui_port) as comfyui,
        MiniMaxSim(host=args.bind, port=args.minimax_port) as minimax,
    ):
        comfyui.execution_s = args.execution_s
        minimax.host = args.public_host  # its download URLs must name the host the containers see
        state_file = Path(args.state)
        while not stop.is_set():
            _write(
                state_file,
                {
                    "prompt_posts": sum(comfyui.prompt_posts.values()),
                    "prompt_posts_by_id": dict(comfyui.prompt_posts),
                    "prompts_done": sorted(comfyui.history),
                    "minimax_creates": minimax.create_calls,
                    "minimax_tasks": minimax.tasks_created,
                },
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bind", required=True, help="address to listen on")
    parser.add_argument("--public-host", default="host.containers.internal")
    parser.add_argument("--comfyui-port", type=int, required=True)
    parser.add_argument("--minimax-port", type=int, required=True)
    parser.add_argument("--execution-s", type=float, default=3.0, help="ComfyUI render time")
    parser.add_argument("--state", required=True, help="JSON file the counters are written to")
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
