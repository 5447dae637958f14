"""Inputs and results of the MiniMax activities (the CLOUD route).

No model here ever holds the API key: the activities read it from the worker's settings.
"""

from __future__ import annotations

from pydantic import BaseModel

from spillway.models import CloudRequest


class MiniMaxCreate(BaseModel):
    job_id: str
    request: CloudRequest


class MiniMaxCreated(BaseModel):
    task_id: str


class MiniMaxPoll(BaseModel):
    job_id: str
    task_id: str


class MiniMaxDone(BaseModel):
    task_id: str
    file_id: str
    video_width: int | None = None
    video_height: int | None = None


class MiniMaxDownload(BaseModel):
    job_id: str
    task_id: str
    file_id: str
