"""The load probe's NVML reading against `nvidia-smi`, idle and under a matrix-product load.

Run on a machine with an NVIDIA GPU, PyTorch and `nvidia-ml-py` (the numbers in
docs/hosts.md, "Is a GPU host busy?", came from one): `python3 scripts/device_nvml.py
[--seconds 20]`. It reads GPU 0 through the same `NvmlReader` and `read_apart` the probe and
the agents use, pairs each reading with `nvidia-smi`'s, and prints a table. Only pydantic and
pynvml are needed besides PyTorch: the reader's module is loaded by its path, so the rest of
spillway need not be installed.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

NVML_PY = Path(__file__).resolve().parent.parent / "activities" / "probe" / "nvml.py"

LOAD = """
import sys, time, torch
hold = torch.empty(int(sys.argv[2]) << 30, dtype=torch.uint8, device="cuda")
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print("loaded", flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
"""


def _load_reader_module() -> Any:
    spec = importlib.util.spec_from_file_location("spillway_nvml", NVML_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _smi() -> tuple[float, int, int]:
    out = subprocess.run(
        [
            "nvidia-smi",
            "--id=0",
            "--query-gpu=utilization.gpu,memory.used,memory.total",
            "--format=csv,noheader,nounits",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    util, used, total = (part.strip() for part in out.strip().split(","))
    return float(util), int(used) << 20, int(total) << 20


async def _samples(nvml: Any, reader: Any, phase: str, count: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for _ in range(count):
        reading = await nvml.read_apart(reader, 0)
        smi_util, smi_used, smi_total = _smi()
        rows.append(
            {
                "phase": phase,
                "t": round(time.monotonic(), 2),
                "nvml_util_pct": reading.util_pct,
                "smi_util_pct": smi_util,
                "nvml_used_mib": reading.memory_used_bytes >> 20,
                "smi_used_mib": smi_used >> 20,
                "nvml_total_mib": reading.memory_total_bytes >> 20,
                "smi_total_mib": smi_total >> 20,
                "name": reading.name,
            }
        )
        await asyncio.sleep(1.0)
    return rows


async def collect(args: argparse.Namespace) -> list[dict[str, Any]] | None:
    nvml = _load_reader_module()
    reader = nvml.NvmlReader()
    start = time.monotonic()
    try:
        first = await nvml.read_apart(reader, 0)
    except nvml.GpuReadError as exc:
        print(f"no GPU reading: {exc}", file=sys.stderr)
        return None
    print(f"first read: {time.monotonic() - start:.3f} s (NVML initialised)", flush=True)
    start = time.monotonic()
    for _ in range(100):
        await nvml.read_apart(reader, 0)
    print(f"read_apart, mean of 100: {(time.monotonic() - start) * 10:.2f} ms", flush=True)
    print(f"GPU 0: {first.name}", flush=True)

    rows = await _samples(nvml, reader, "idle", 5)
    load = await asyncio.create_subprocess_exec(
        sys.executable, "-c", LOAD, str(args.seconds), str(args.hold_gib), stdout=subprocess.PIPE
    )
    assert load.stdout is not None
    await load.stdout.readline()  # "loaded": memory held, products about to start
    await asyncio.sleep(2.0)
    rows += await _samples(nvml, reader, "load", max(3, int(args.seconds) - 6))
    await load.wait()
    await asyncio.sleep(2.0)
    rows += await _samples(nvml, reader, "after", 3)
    reader.close()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the load runs")
    parser.add_argument("--hold-gib", type=int, default=40, help="GPU memory the load holds")
    parser.add_argument("--json", type=Path, help="also write every sample here")
    args = parser.parse_args()
    rows = asyncio.run(collect(args))
    if rows is None:
        return 1

    print(f"{'phase':6} {'NVML util':>9} {'smi util':>8} {'NVML MiB':>9} {'smi MiB':>8}")
    for row in rows:
        print(
            f"{row['phase']:6} {row['nvml_util_pct']:9.0f} {row['smi_util_pct']:8.0f} "
            f"{row['nvml_used_mib']:9d} {row['smi_used_mib']:8d}"
        )
    for phase in ("idle", "load", "after"):
        part = [r for r in rows if r["phase"] == phase]
        gap = [abs(float(r["nvml_util_pct"]) - float(r["smi_util_pct"])) for r in part]
        mem = [abs(int(r["nvml_used_mib"]) - int(r["smi_used_mib"])) for r in part]
        ours = statistics.median(float(r["nvml_util_pct"]) for r in part)
        theirs = statistics.median(float(r["smi_util_pct"]) for r in part)
        print(
            f"{phase}: NVML util median {ours:.0f} %, nvidia-smi {theirs:.0f} %;"
            f" largest gap {max(gap):.0f} points, memory {max(mem)} MiB"
        )
    print(f"total: NVML {rows[0]['nvml_total_mib']} MiB, nvidia-smi {rows[0]['smi_total_mib']} MiB")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "nvml.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
