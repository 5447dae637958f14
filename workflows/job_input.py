"""Reading a job's input inside VideoJobWorkflow, so that input no client should have sent (any
language, any SDK: `temporal workflow start --input ...`) fails the job at once with a message
naming each bad field, instead of a workflow task that cannot decode its arguments and retries
forever (docs/design.md, "Clients, inputs and outputs")."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from temporalio import workflow
from temporalio.common import RawValue

with workflow.unsafe.imports_passed_through():
    from spillway.models import VideoJob
    from spillway.settings import describe_validation_error

NAME = "VideoJobWorkflow"  # what clients start: the workflow's input is the JSON of VideoJob


def read_job(raw: RawValue) -> VideoJob | str:
    """The job, or why it is not one."""
    try:
        value: Any = workflow.payload_converter().from_payload(raw.payload)
    except Exception as exc:  # any converter error: the payload is not JSON
        return f"invalid job input: not JSON ({type(exc).__name__})"
    try:
        job = VideoJob.model_validate(value)
    except ValidationError as exc:
        return describe_validation_error(exc, "job input")
    if job.job_id != workflow.info().workflow_id:
        return (
            f"invalid job input: job_id {job.job_id!r} is not the workflow id "
            f"{workflow.info().workflow_id!r}: start the workflow with id = job_id"
        )
    return job


def placeholder(job_id: str) -> VideoJob:
    """What a job whose input could not be read shows until it fails (at once)."""
    return VideoJob.model_construct(job_id=job_id, graph={}, cloud=None, carry=None)
