"""Load-probe latency on loopback: healthy p50/p99, and the total time with one and with all three
sources hanging, next to the same measurements run one after another (the ratio is the figure).

    .venv/bin/python bench/load_probe.py [--probes 300] [--timeout 2]

NVML readings are injected (no driver needed); the HTTP sources are the loopback doubles.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from activities.probe.activities import LoadStatusActivities
from activities.probe.nvml import GpuReading
from spillway.core.settings import Settings
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.guard import GuardSim


class InjectedGpu:
    def __init__(self) -> None:
        self.hang = False
        self.release = threading.Event()

    def read(self, index: int) -> GpuReading:
        if self.hang:
            self.release.wait(timeout=60)
        return GpuReading(
            index=index, name="NVIDIA A40", util_pct=40, memory_used_bytes=1, memory_total_bytes=2
        )


async def timed(fn: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    await fn()
    return time.perf_counter() - started


def percentile(samples: list[float], q: int) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1]


async def main(probes: int, timeout_s: float) -> None:
    gpu = InjectedGpu()
    async with ComfyUISim() as comfyui, GuardSim() as guard, httpx.AsyncClient() as http:
        comfyui.set_vram_used_pct(42.4)
        settings = Settings(
            COMFYUI_URL=comfyui.url, A40_GUARD_URL=guard.url, LOAD_PROBE_TIMEOUT_S=timeout_s
        )
        acts = LoadStatusActivities(http, settings, gpu)

        async def sequential() -> None:
            for measure in acts.measurements():
                await measure()

        for _ in range(20):  # warm the connection pool and the thread pool
            await acts.probe()
        healthy = [await timed(acts.probe) for _ in range(probes)]
        healthy_seq = [await timed(sequential) for _ in range(probes)]
        print(f"load probe on loopback, LOAD_PROBE_TIMEOUT_S={timeout_s:g}, {probes} probes each")
        print(f"{'case':<34}{'concurrent':>14}{'one by one':>14}{'ratio':>8}")
        for q in (50, 99):
            c, s = percentile(healthy, q) * 1000, percentile(healthy_seq, q) * 1000
            print(f"{f'healthy p{q} (ms)':<34}{c:>14.2f}{s:>14.2f}{s / c:>8.2f}")

        guard.faults["*"] = "hang"
        one = await timed(acts.probe), await timed(sequential)
        print(f"{'guard hanging (s)':<34}{one[0]:>14.2f}{one[1]:>14.2f}{one[1] / one[0]:>8.2f}")

        comfyui.faults["*"] = "hang"
        gpu.hang = True
        every = await timed(acts.probe), await timed(sequential)
        print(
            f"{'all three hanging (s)':<34}{every[0]:>14.2f}{every[1]:>14.2f}"
            f"{every[1] / every[0]:>8.2f}"
        )

        # The whole command, process start included, against the same hanging sources.
        env = os.environ | {
            "COMFYUI_URL": comfyui.url,
            "A40_GUARD_URL": guard.url,
            "LOAD_PROBE_TIMEOUT_S": str(timeout_s),
        }
        spillway = str(Path(sys.executable).parent / "spillway")
        started = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            spillway, "load", "--json", env=env, stdout=asyncio.subprocess.DEVNULL
        )
        await proc.wait()
        cli = time.perf_counter() - started
        print(f"{'`spillway load`, all hanging (s)':<34}{cli:>14.2f}   bound {timeout_s + 1:g}s")
        gpu.release.set()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--probes", type=int, default=300)
    parser.add_argument("--timeout", type=float, default=2.0)
    args = parser.parse_args()
    asyncio.run(main(args.probes, args.timeout))
