"""The baselines of bench/comfyui_route.py: workflows that run a job's number of no-op
activities in a row, the first of them on the workflow's own queue, as a job reads its policy.
`BareWorkflow` runs the rest on its own queue; `JobShapedWorkflow` runs them where a LOCAL job
runs its probe, submit, wait and download, with the same options."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.common import Priority

from spillway.core.hosts import WAITS_SUFFIX
from workflows.activity_calls import (
    PROBE_BOUND,
    HostCall,
    comfyui_download,
    comfyui_submit,
    comfyui_wait,
    heartbeating,
)

TIMEOUT = timedelta(seconds=30)


@activity.defn(name="bench_noop")
async def noop(step: int) -> int:
    return step


@workflow.defn(name="BareWorkflow")
class BareWorkflow:
    @workflow.run
    async def run(self, steps: int) -> None:
        for step in range(steps):
            await workflow.execute_activity(noop, step, start_to_close_timeout=TIMEOUT)


@workflow.defn(name="JobShapedWorkflow")
class JobShapedWorkflow:
    """`host_queue`: the GPU host's queue; its waits queue is `host_queue` + WAITS_SUFFIX."""

    @workflow.run
    async def run(self, host_queue: str) -> None:
        priority = Priority(priority_key=3)  # a job's default
        await workflow.execute_activity(noop, 0, start_to_close_timeout=TIMEOUT)
        await workflow.execute_activity(
            noop,
            1,
            task_queue=host_queue,
            priority=priority,
            schedule_to_start_timeout=PROBE_BOUND,
            start_to_close_timeout=timedelta(seconds=60),
        )
        calls: list[HostCall[Any, Any]] = [comfyui_submit, comfyui_wait, comfyui_download]
        for step, call in enumerate(calls, start=2):
            queue = host_queue + WAITS_SUFFIX if call.waits else host_queue
            options = heartbeating(
                queue, priority, TIMEOUT, start_to_close=call.start_to_close, retry=call.retry
            )
            await workflow.execute_activity(noop, step, **options)


@workflow.defn(name="WaitingWorkflow")
class WaitingWorkflow:
    """A job's shape up to its wait in line (bench/line_memory.py's floor): an input the size of
    a job's (`graph`), the three steps a job takes before it asks for a place (policy, probe,
    fit) as no-op activities, then a wait for a signal beside a timer, as a job waits for the
    pool's answer beside its ask-again timer."""

    def __init__(self) -> None:
        self.answered = False

    @workflow.run
    async def run(self, graph: dict[str, Any]) -> None:
        for step in range(3):
            await workflow.execute_activity(noop, step, start_to_close_timeout=TIMEOUT)
        await workflow.wait_condition(lambda: self.answered, timeout=timedelta(hours=1))

    @workflow.signal
    def answer(self) -> None:
        self.answered = True
