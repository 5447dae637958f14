"""The MiniMax activities' inputs and results (the CLOUD route). MiniMax's own answers and what
its codes mean are in `spillway/minimax_answers.py`.

No model here ever holds the API key: the activities read it from the worker's settings.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from spillway.models import CloudRequest, JobId
from spillway.spend_models import Authorisation


class MiniMaxCreate(BaseModel):
    # JobId's pattern also keeps the job's output folder inside SPILLWAY_OUTPUT_DIR.
    job_id: JobId
    request: CloudRequest
    # Who allowed the spending; "armed" is checked against the worker's settings at the create.
    # The default is the strictest reading, for creates scheduled before the field existed.
    authorisation: Authorisation = "armed"
    simulated: bool = False  # the job was decided by a simulated worker (spillway dev --simulate)


class MiniMaxCreated(BaseModel):
    task_id: str
    # When MiniMax accepted the task (UTC) and how many create requests it took: every request
    # before the last one was answered with an explicit "no", so none of them made a task.
    created_at: datetime | None = None
    create_calls: int = 1
    # False when the spend ledger did not take the task id: the workflow records it again.
    settled: bool = True


class MiniMaxPoll(BaseModel):
    job_id: JobId
    task_id: str


class MiniMaxDone(BaseModel):
    task_id: str
    file_id: str
    video_width: int | None = None
    video_height: int | None = None


class MiniMaxDownload(BaseModel):
    job_id: JobId
    task_id: str
    file_id: str
