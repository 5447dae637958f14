"""The NVML reader, written against pynvml. No NVIDIA driver here: readings are injected by
replacing pynvml's functions, and the real "library not found" path is exercised as it is."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pynvml
import pytest

from activities.probe.nvml import GpuReadError, NvmlReader, _ReadThread, read_apart

GIB = 1024**3


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    state = SimpleNamespace(
        inits=0, util=73, used=31 * GIB, total=48 * GIB, reserved=GIB // 2, v2=True, fail=None
    )

    def init() -> None:
        state.inits += 1

    def handle(index: int) -> object:
        if state.fail is not None:
            raise state.fail
        return ("handle", index)

    monkeypatch.setattr(pynvml, "nvmlInit", init)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", handle)
    monkeypatch.setattr(
        pynvml, "nvmlDeviceGetUtilizationRates", lambda h: SimpleNamespace(gpu=state.util, memory=5)
    )

    def memory(h: object, version: int | None = None) -> SimpleNamespace:
        if version is None:  # v1 counts the driver's reserved memory as used
            used = state.used + state.reserved
            return SimpleNamespace(used=used, total=state.total, free=state.total - used)
        if not state.v2:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        assert version == pynvml.nvmlMemory_v2
        free = state.total - state.used - state.reserved
        return SimpleNamespace(
            used=state.used, reserved=state.reserved, total=state.total, free=free
        )

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", memory)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda h: "NVIDIA A40")
    return state


def test_reads_utilisation_and_memory_of_the_configured_gpu(fake_nvml):
    reader = NvmlReader()
    reading = reader.read(0)
    assert reading.util_pct == 73.0 and reading.name == "NVIDIA A40"
    assert (reading.memory_used_bytes, reading.memory_total_bytes) == (31 * GIB, 48 * GIB)
    fake_nvml.util = 99
    assert reader.read(0).util_pct == 99.0
    assert fake_nvml.inits == 1  # initialised once, then kept


def test_memory_used_leaves_out_what_the_driver_reserves_as_nvidia_smi_does(fake_nvml):
    assert NvmlReader().read(0).memory_used_bytes == 31 * GIB
    fake_nvml.v2 = False  # a driver before R510: only the original call
    assert NvmlReader().read(0).memory_used_bytes == 31 * GIB + GIB // 2


def test_bytes_device_names_from_older_drivers_are_decoded(fake_nvml, monkeypatch):
    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda h: b"NVIDIA A40")
    assert NvmlReader().read(0).name == "NVIDIA A40"


def test_nvml_errors_become_one_line_read_errors(fake_nvml):
    fake_nvml.fail = pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    with pytest.raises(GpuReadError, match="NVML error on GPU 3: Invalid Argument") as raised:
        NvmlReader().read(3)
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def _driver_present() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.skipif(_driver_present(), reason="this host has an NVIDIA driver")
def test_without_a_driver_the_reader_says_so_in_one_line():
    # The real pynvml on a host without libnvidia-ml: this very machine.
    reader = NvmlReader()
    with pytest.raises(GpuReadError) as raised:
        reader.read(0)
    assert "NVML library not found" in str(raised.value)
    with pytest.raises(GpuReadError):  # retried, not cached as broken forever
        reader.read(0)
    reader.close()


async def test_reads_apart_run_on_nvmls_own_thread(fake_nvml, monkeypatch):
    threads = []
    real = NvmlReader.read

    def read(self: NvmlReader, index: int):
        threads.append(threading.current_thread())
        return real(self, index)

    monkeypatch.setattr(NvmlReader, "read", read)
    reader = NvmlReader()
    assert (await read_apart(reader, 0)).util_pct == 73.0
    assert (await read_apart(reader, 0)).util_pct == 73.0  # the thread is free again
    # one thread, kept between reads (starting one per read held the event loop up)
    assert threads[0] is threads[1] and threads[0].name == "nvml"


async def test_any_exception_in_a_read_apart_is_one_line_read_error(fake_nvml):
    fake_nvml.fail = ZeroDivisionError("division by zero")
    with pytest.raises(GpuReadError, match=r"^ZeroDivisionError: division by zero$"):
        await read_apart(NvmlReader(), 0)


async def test_an_idle_reader_thread_ends_and_the_next_read_starts_another(fake_nvml):
    reader = NvmlReader()
    apart = _ReadThread(reader)
    apart.IDLE_S = 0.05
    assert (await apart.read(0)).util_pct == 73.0
    first = apart._thread
    assert first is not None
    first.join(timeout=5)
    assert apart._thread is None
    assert (await apart.read(0)).util_pct == 73.0


async def test_reads_asked_for_together_share_one_read(fake_nvml, monkeypatch):
    reads = []
    real = NvmlReader.read

    def read(self: NvmlReader, index: int):
        reads.append(index)
        return real(self, index)

    monkeypatch.setattr(NvmlReader, "read", read)
    reader = NvmlReader()
    readings = await asyncio.gather(*(read_apart(reader, 0) for _ in range(10)))
    assert [r.util_pct for r in readings] == [73.0] * 10 and reads == [0]
