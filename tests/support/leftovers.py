"""What a failed test leaves running ends with it, within a bound.

pytest-timeout stops a test by raising inside the session's event loop: the test's task and the
tasks it started (workers, doubles' waits) stay pending in that loop, beside every later test,
and at the end `asyncio.Runner.close()` waits for them without a limit (a worker whose server is
gone never finishes shutting down: the whole run then hangs until CI kills it). So after a
failed test its new tasks are cancelled and given `GRACE_S` to end; at the end of the session
whatever is still pending is cancelled the same way; a task that will not end is reported with
its stack and let go, so that the run ends red, and with a reason, instead of never.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterator

import pytest

GRACE_S = 30.0
_FAILED = pytest.StashKey[bool]()
_STUCK = pytest.StashKey[list[str]]()


def _runner_loop(request: pytest.FixtureRequest) -> asyncio.AbstractEventLoop:
    runner: asyncio.Runner = request.getfixturevalue("_session_scoped_runner")
    return runner.get_loop()


def end(loop: asyncio.AbstractEventLoop, tasks: set[asyncio.Task[object]]) -> list[str]:
    """Cancels `tasks` and runs the loop until they end or `GRACE_S` passes; the stacks of
    those that did not end, which are taken off the loop's task list."""
    pending = {t for t in tasks if not t.done()}
    if not pending:
        return []
    for task in pending:
        task.cancel()
    _, stuck = loop.run_until_complete(asyncio.wait(pending, timeout=GRACE_S))
    stacks = []
    for task in stuck:
        out = io.StringIO()
        task.print_stack(file=out)
        stacks.append(out.getvalue())
        asyncio.tasks._unregister_task(task)
    return stacks


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    if report.when == "call":  # type: ignore[attr-defined]
        item.stash[_FAILED] = report.failed  # type: ignore[attr-defined]
    return report


@pytest.fixture(autouse=True)
def _end_what_a_failed_test_left(request: pytest.FixtureRequest) -> Iterator[None]:
    loop = _runner_loop(request)
    before = asyncio.all_tasks(loop)
    yield
    if request.node.stash.get(_FAILED, False) and not loop.is_running():
        stuck = end(loop, asyncio.all_tasks(loop) - before)
        request.config.stash.setdefault(_STUCK, []).extend(stuck)


@pytest.fixture(scope="session", autouse=True)
def _end_what_the_session_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """Set up before, so torn down after, every other fixture of the session's loop."""
    loop = _runner_loop(request)
    yield
    stuck = request.config.stash.get(_STUCK, [])
    if not loop.is_running():
        stuck += end(loop, asyncio.all_tasks(loop))
    assert not stuck, f"{len(stuck)} tasks did not end when cancelled:\n" + "\n".join(stuck)
