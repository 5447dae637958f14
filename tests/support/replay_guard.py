"""Every history replays: at the end of a test server's life, every run on it is fetched and
replayed against today's workflow code with Temporal's Replayer, as assert_replay does for one
task queue (tests/reliability/harness.py). A run whose replayed activations differ from its live
ones (a nondeterminism error) would stall at the next worker without it in its cache, as after a
crash or a deploy. Wired by tests/conftest.py (`env`, `dev_env`) and tests/reliability/conftest.py
(every DevServer); a failure fails the run, naming the workflow, its run, the test that started
it and the failure (which names the event); `replay guard: replayed N histories on ...` lines
show at the end of the run.

Which runs: a server with visibility (the dev server) lists them all. The time-skipping test
server has no ListWorkflowExecutions, so a `ServerGuard`'s interceptor, on the session's client,
notes every workflow a client starts and every run a worker of that client executes (children,
continued runs, the ledger and the pools included); either way each fetched history's links are
followed too (children, the runs before and after a continue-as-new, a retry or a reset), and
each noted workflow id's latest run is added.

Which code: REPLAYED (worker.py) plus the tests' own workflows (tests/support/workflows.py,
callback_workflow.py). A Replayer takes one class per workflow name, and some tests' workflows
are named as spillway's job (CreateOnce, CloudOnce, ForeignJob: named VideoJobWorkflow on
purpose); a run that a worker executed with such a class is replayed with that class (the
interceptor notes each run's class), every other run of the name with VideoJobWorkflow.

Replays run outside the sandbox: the workers that ran them ran in it (a sandbox violation fails
there), and what the guard looks for is a history the code no longer follows; unsandboxed, a
replay costs a fraction of the time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

import pytest
from temporalio import workflow
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import (
    Client,
    OutboundInterceptor,
    StartWorkflowInput,
    StartWorkflowUpdateWithStartInput,
    WorkflowHandle,
    WorkflowHistory,
    WorkflowUpdateHandle,
)
from temporalio.client import Interceptor as ClientInterceptor
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import (
    ExecuteWorkflowInput,
    Replayer,
    UnsandboxedWorkflowRunner,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)
from temporalio.worker import Interceptor as WorkerInterceptor

from spillway.core import names
from tests.support.callback_workflow import FireAndForget, JobThatCallsBack
from tests.support.workflows import ProbeOnce, RenderLocally, SubmitOnce
from worker import REPLAYED

# The classes every run is replayed with unless a worker ran it with another class of the same
# name (see the module's docstring).
WORKFLOWS: list[type] = [
    *REPLAYED,
    ProbeOnce,
    SubmitOnce,
    RenderLocally,
    JobThatCallsBack,
    FireAndForget,
]
FETCHES = 16  # histories fetched at once
REPLAYERS = 2  # replayers at once, one history each at a time (the CI machine has 2 cores)
EXTERN = "replay_guard_ran"  # the function the workflow interceptor calls out of the sandbox

REPORTS = pytest.StashKey[list["Report"]]()


def _name(cls: type) -> str:
    defn = getattr(cls, "__temporal_workflow_definition")
    return str(defn.name)


_DEFAULTS = {_name(cls): cls for cls in WORKFLOWS}
assert len(_DEFAULTS) == len(WORKFLOWS), "two classes of one workflow name in WORKFLOWS"

_current_test = "(no test: a fixture's setup)"


def now_running(nodeid: str) -> None:
    """The test whose workflows are being started (tests/conftest.py calls it for each)."""
    global _current_test
    _current_test = nodeid


@dataclasses.dataclass(frozen=True)
class Ran:
    """What a worker of the session ran a run with: its class (module, qualified name)."""

    module: str
    qualname: str


@dataclasses.dataclass
class Report:
    server: str
    replayed: int
    gone: int  # noted runs not on the server (a test deleted them, or their start was refused)
    seconds: float
    failures: list[str]

    def line(self) -> str:
        gone = f", {self.gone} noted runs not found (deleted, or never started)"
        failed = f", {len(self.failures)} FAILED"
        return (
            f"replay guard: replayed {self.replayed} histories on {self.server} "
            f"in {self.seconds:.1f} s{gone if self.gone else ''}{failed if self.failures else ''}"
        )


class ServerGuard:
    """The runs of one server: noted by `interceptor` (put it on the clients tests and workers
    use: `recording(client)`, or `interceptors=[guard.interceptor]`), and listed if `listable`;
    `check(client, config)` replays them all before the server stops."""

    def __init__(self, server: str, *, listable: bool) -> None:
        self.server = server
        self.listable = listable
        self.runs: set[tuple[str, str | None]] = set()  # (workflow id, run id or latest)
        self.ran: dict[str, Ran] = {}  # by run id
        self.tests: dict[str, str] = {}  # the test that started or first ran a workflow id
        self.queue_tests: dict[str, str] = {}  # the test that started a workflow on a queue
        self.interceptor = _Recorder(self)
        self.checked = False

    def recording(self, client: Client) -> Client:
        """The same connection, with this guard's interceptor (its workers' too)."""
        config = client.config()
        config["interceptors"] = [*config["interceptors"], self.interceptor]
        return Client(**config)

    def started(self, workflow_id: str, run_id: str | None, task_queue: str | None) -> None:
        self.runs.add((workflow_id, run_id))
        self.tests.setdefault(workflow_id, _current_test)
        if task_queue is not None:
            for queue in (task_queue, names.pool_queue(task_queue)):
                self.queue_tests.setdefault(queue, _current_test)

    def executed(self, workflow_id: str, run_id: str, ran: Ran) -> None:
        self.ran[run_id] = ran
        self.started(workflow_id, run_id, None)

    async def check(self, client: Client, config: pytest.Config) -> Report:
        """Replay every run; the report goes to the end-of-run summary. Raises AssertionError
        naming every run that does not replay."""
        self.checked = True
        report = await self.replay(client)
        config.stash.setdefault(REPORTS, []).append(report)
        assert not report.failures, (
            f"replay guard: {len(report.failures)} of {report.replayed} histories on "
            f"{self.server} do not replay against today's workflow code:\n"
            + "\n".join(report.failures)
        )
        return report

    async def replay(self, client: Client) -> Report:
        start = time.monotonic()
        histories, gone = await self._fetch(client)
        groups: dict[Ran | None, list[tuple[str, WorkflowHistory]]] = {}
        failures = []
        for run_id, history in histories:
            try:
                key = self._replayed_with(run_id, history)
            except LookupError as exc:
                failures.append(self._describe(run_id, history, str(exc)))
                continue
            groups.setdefault(key, []).append((run_id, history))
        default = groups.pop(None, [])
        batches: list[tuple[Ran | None, list[tuple[str, WorkflowHistory]]]] = [
            (None, default[i::REPLAYERS]) for i in range(REPLAYERS)
        ]
        batches += groups.items()
        for found in await asyncio.gather(*(self._replay(key, runs) for key, runs in batches)):
            failures += found
        return Report(self.server, len(histories), gone, time.monotonic() - start, failures)

    def _replayed_with(self, run_id: str, history: WorkflowHistory) -> Ran | None:
        """None: the common Replayer (WORKFLOWS); otherwise the class a worker ran it with."""
        name = _started(history).workflow_type.name
        ran = self.ran.get(run_id)
        if ran is None or _DEFAULTS.get(name) is _resolve(ran):
            if name not in _DEFAULTS:
                raise LookupError(f"no workflow class named {name!r} to replay it with")
            return None
        return ran

    async def _replay(self, key: Ran | None, runs: list[tuple[str, WorkflowHistory]]) -> list[str]:
        if not runs:
            return []
        replayer = Replayer(
            workflows=WORKFLOWS if key is None else [_resolve(key)],
            data_converter=pydantic_data_converter,
            workflow_runner=_UNSANDBOXED,
        )
        failures = []

        async def histories() -> AsyncIterator[WorkflowHistory]:
            for _, history in runs:
                yield history

        async with replayer.workflow_replay_iterator(histories()) as results:
            index = 0
            async for result in results:
                run_id, history = runs[index]
                index += 1
                if result.replay_failure is not None:
                    failures.append(self._describe(run_id, history, str(result.replay_failure)))
        return failures

    def _describe(self, run_id: str, history: WorkflowHistory, failure: str) -> str:
        started = _started(history)
        test = self.tests.get(history.workflow_id) or self.queue_tests.get(
            started.task_queue.name, "(not noted: started by a worker process or the CLI)"
        )
        return (
            f"- {started.workflow_type.name} {history.workflow_id} run {run_id} "
            f"(task queue {started.task_queue.name}; test {test}):\n    {failure}"
        )

    async def _fetch(self, client: Client) -> tuple[list[tuple[str, WorkflowHistory]], int]:
        """Every run noted or listed, and every run their histories link to."""
        seeds = set(self.runs)
        if self.listable:
            async for execution in client.list_workflows():
                seeds.add((execution.id, execution.run_id))
        seeds |= {(workflow_id, None) for workflow_id, _ in self.runs}  # its latest run
        seen: set[str] = set()
        fetched: list[tuple[str, WorkflowHistory]] = []
        gone = 0
        limit = asyncio.Semaphore(FETCHES)

        async def fetch(workflow_id: str, run_id: str | None) -> None:
            nonlocal gone
            async with limit:
                try:
                    if run_id is None:
                        run_id = (await client.get_workflow_handle(workflow_id).describe()).run_id
                    if run_id in seen:
                        return
                    seen.add(run_id)
                    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
                    history = await handle.fetch_history()
                except RPCError as exc:
                    if exc.status != RPCStatusCode.NOT_FOUND:
                        raise
                    gone += 1
                    return
            fetched.append((run_id, history))
            for linked_id, linked_run in _links(history):
                if linked_run and linked_run not in seen:
                    group.create_task(fetch(linked_id, linked_run))

        async with asyncio.TaskGroup() as group:
            for seed in seeds:
                group.create_task(fetch(*seed))
        fetched.sort(key=lambda run: (run[1].workflow_id, run[0]))
        return fetched, gone


def _started(history: WorkflowHistory) -> Any:
    return history.events[0].workflow_execution_started_event_attributes


def _links(history: WorkflowHistory) -> Iterator[tuple[str, str]]:
    """The runs a history names: its children, the runs before it (continue-as-new, retry,
    cron, reset) and the run after it."""
    own = history.workflow_id
    started = _started(history)
    for run_id in (
        started.continued_execution_run_id,
        started.first_execution_run_id,
        started.original_execution_run_id,
    ):
        yield own, run_id
    for event in history.events:
        yield from _event_links(own, event)


def _event_links(own: str, event: HistoryEvent) -> Iterator[tuple[str, str]]:
    if event.HasField("child_workflow_execution_started_event_attributes"):
        child = event.child_workflow_execution_started_event_attributes.workflow_execution
        yield child.workflow_id, child.run_id
    for field in (
        "workflow_execution_continued_as_new_event_attributes",
        "workflow_execution_completed_event_attributes",
        "workflow_execution_failed_event_attributes",
        "workflow_execution_timed_out_event_attributes",
    ):
        if event.HasField(field):
            yield own, getattr(event, field).new_execution_run_id
    if event.HasField("workflow_task_failed_event_attributes"):
        yield own, event.workflow_task_failed_event_attributes.new_run_id


def _resolve(ran: Ran) -> type:
    """The class a worker ran (imported by this process: the test module that defined it)."""
    module = sys.modules.get(ran.module)
    found: Any = module
    for part in ran.qualname.split("."):
        found = getattr(found, part, None)
    if not isinstance(found, type):
        raise LookupError(f"the class it ran with, {ran.module}.{ran.qualname}, is not loaded")
    return found


_UNSANDBOXED = UnsandboxedWorkflowRunner()


class _Recorder(ClientInterceptor, WorkerInterceptor):
    """On a client: notes each workflow it starts; on its workers (a client's interceptors that
    are also worker interceptors go to every worker made with it), each run they execute."""

    def __init__(self, guard: ServerGuard) -> None:
        self.guard = guard

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        return _Starts(next, self.guard)

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor]:
        input.unsafe_extern_functions[EXTERN] = self.guard.executed
        return _Runs


class _Starts(OutboundInterceptor):
    def __init__(self, next: OutboundInterceptor, guard: ServerGuard) -> None:
        super().__init__(next)
        self.guard = guard

    async def start_workflow(self, input: StartWorkflowInput) -> WorkflowHandle[Any, Any]:
        self.guard.started(input.id, None, input.task_queue)
        handle = await super().start_workflow(input)
        self.guard.started(input.id, handle.result_run_id, input.task_queue)
        return handle

    async def start_update_with_start_workflow(
        self, input: StartWorkflowUpdateWithStartInput
    ) -> WorkflowUpdateHandle[Any]:
        start = input.start_workflow_input
        self.guard.started(start.id, None, start.task_queue)
        return await super().start_update_with_start_workflow(input)


class _Runs(WorkflowInboundInterceptor):
    """Tells the guard, from inside the workflow (the sandbox's, if any), which class runs it."""

    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        info = workflow.info()
        ran = Ran(input.type.__module__, input.type.__qualname__)
        executed: Callable[[str, str, Ran], None] = workflow.extern_functions()[EXTERN]
        executed(info.workflow_id, info.run_id, ran)
        return await super().execute_workflow(input)


PER_TEST = "the time-skipping test server of "  # `env`: a server of each test's own


def send_to_controller(config: pytest.Config) -> None:
    """In a pytest-xdist worker process: its reports go to the process that prints the summary."""
    output = getattr(config, "workeroutput", None)
    if output is not None:
        output["replay_reports"] = [dataclasses.asdict(r) for r in config.stash.get(REPORTS, [])]


def received_from(node: Any) -> None:
    """In the controller: a worker process's reports, when it ends."""
    reports = getattr(node, "workeroutput", {}).get("replay_reports", [])
    node.config.stash.setdefault(REPORTS, []).extend(Report(**r) for r in reports)


def summary(config: pytest.Config) -> Sequence[Report]:
    """The reports of the guards that ran, for the end-of-run summary: those of the tests'
    own time-skipping servers as one."""
    reports = config.stash.get(REPORTS, [])
    own = [r for r in reports if r.server.startswith(PER_TEST)]
    if not own:
        return reports
    merged = Report(
        server=f"{len(own)} time-skipping test servers (one per test)",
        replayed=sum(r.replayed for r in own),
        gone=sum(r.gone for r in own),
        seconds=sum(r.seconds for r in own),
        failures=[f for r in own for f in r.failures],
    )
    return [merged, *(r for r in reports if not r.server.startswith(PER_TEST))]
