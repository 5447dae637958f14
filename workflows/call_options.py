"""What the typed activity calls (workflows/calls.py, workflows/comfyui_calls.py) share: the
retry policy of free reads, and the options of a long activity that heartbeats on a queue of
its choosing.

Workflow code only."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio.common import Priority, RetryPolicy

# Reads that cost nothing may retry for as long as it takes; a stuck one is visible in the UI.
FREE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30)
)


def heartbeating(
    task_queue: str | None,
    priority: Priority,
    heartbeat: timedelta,
    *,
    start_to_close: timedelta,
    retry: RetryPolicy,
) -> Any:
    """`execute_activity_method`'s options for an activity that heartbeats: `heartbeat` is how
    soon a dead worker's activity moves on; `task_queue` None is the workflow's own."""
    return {
        "task_queue": task_queue,
        "priority": priority,
        "start_to_close_timeout": start_to_close,
        "heartbeat_timeout": heartbeat,
        "retry_policy": retry,
    }
