"""`python -m spillway.sim`: the ComfyUI, MiniMax and guard doubles in a process of their own.

Prints one JSON line with their URLs (and the MiniMax key the double expects), then serves until
SIGINT/SIGTERM. Used by benchmarks, so the doubles do not share the worker's CPU time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal

from spillway.sim.comfyui import ComfyUISim
from spillway.sim.guard import GuardSim
from spillway.sim.minimax import SIM_API_KEY, MiniMaxSim


async def serve(comfyui_port: int, minimax_port: int, guard_port: int, execution_s: float) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with (
        ComfyUISim(port=comfyui_port) as comfyui,
        MiniMaxSim(port=minimax_port) as minimax,
        GuardSim(port=guard_port) as guard,
    ):
        comfyui.execution_s = execution_s
        urls = {"comfyui": comfyui.url, "minimax": minimax.url, "guard": guard.url}
        print(json.dumps(urls | {"minimax_key": SIM_API_KEY}), flush=True)
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m spillway.sim", description=__doc__)
    parser.add_argument("--comfyui-port", type=int, default=0)
    parser.add_argument("--minimax-port", type=int, default=0)
    parser.add_argument("--guard-port", type=int, default=0)
    parser.add_argument("--execution-s", type=float, default=3.0, help="ComfyUI render time")
    args = parser.parse_args()
    asyncio.run(serve(args.comfyui_port, args.minimax_port, args.guard_port, args.execution_s))


if __name__ == "__main__":
    main()
