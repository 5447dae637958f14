"""Replays recorded histories of VideoJobWorkflow (local, approved cloud, timed-out approval,
recorded before the spend ledger; armed, approved and over-budget cloud jobs with it): a change
to the workflow that would break running jobs fails here."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.record_histories import NAMES
from worker import WORKFLOWS

HISTORIES = {
    path.stem: path.read_text()
    for path in sorted((Path(__file__).parent / "histories").glob("*.json"))
}


def test_there_are_histories_of_every_main_path():
    assert set(NAMES) <= set(HISTORIES)


@pytest.mark.parametrize("name", list(HISTORIES))
async def test_recorded_history_replays(name: str):
    history = WorkflowHistory.from_json(name, HISTORIES[name])
    # Temporal's default sandbox, not the worker's (worker.WORKFLOW_RUNNER): workflow modules
    # re-imported per run and restricted, so non-deterministic calls fail here.
    replayer = Replayer(workflows=WORKFLOWS, data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)
