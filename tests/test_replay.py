"""Replays the recorded histories of every released version (tests/histories/<version>/: a local
job, an approved and an armed cloud job, a timed-out approval, an over-budget approval, an
image-to-video job of priority 1 with its callback, a job cancelled while the ledger was read, a
Kling create whose worker was lost): a change to the workflow that would break running jobs
fails here."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.record_histories import NAMES, VERSION
from worker import REPLAYED

# A spend ledger of 0.4.0 is not carried over: its handlers awaited a local activity, and 0.5.0's
# only queue requests (other commands), so the upgrade terminates it and restores its entries
# (docs/operations.md, "Releases and running jobs").
LEDGER_REPLACED = {"0.4.0/spend-ledger"}
HISTORIES = {
    f"{path.parent.name}/{path.stem}": path.read_text()
    for path in sorted((Path(__file__).parent / "histories").glob("*/*.json"))
    if f"{path.parent.name}/{path.stem}" not in LEDGER_REPLACED
}


def test_there_are_histories_of_every_main_path_of_this_release():
    assert {f"{VERSION}/{name}" for name in NAMES} <= set(HISTORIES)


@pytest.mark.parametrize("name", list(HISTORIES))
async def test_recorded_history_replays(name: str):
    # The job's id is its workflow id, which the job checks its input against.
    history = WorkflowHistory.from_json(name.split("/")[-1], HISTORIES[name])
    # Temporal's default sandbox, not the worker's (worker.WORKFLOW_RUNNER): workflow modules
    # re-imported per run and restricted, so non-deterministic calls fail here.
    replayer = Replayer(workflows=REPLAYED, data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)
