"""Inputs, results and failure types of the ComfyUI activities (the LOCAL route).

The workflow derives `prompt_id` deterministically (`prompt_id_for`): ComfyUI accepts a caller's
prompt_id but does not deduplicate, so the id is how a retried submit finds its earlier POST.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel

from spillway.core.gpu_pool import PoolLeave
from spillway.core.models import Downloaded, HostCapabilities, JobInput

# ApplicationError types of the ComfyUI activities. Non-retryable ones are also raised with
# non_retryable=True; naming them in a retry policy is documentation, not a requirement.
GRAPH_REJECTED = "ComfyUIGraphRejected"  # 400, or 200 with node_errors: fix the graph
EXECUTION_FAILED = "ComfyUIExecutionFailed"  # execution_error: ComfyUI's exception message
INTERRUPTED = "ComfyUIInterrupted"  # execution_interrupted (someone pressed cancel in ComfyUI)
OUTPUT_MISSING = "ComfyUIOutputMissing"  # /view answered 400/403/404 for an output file
UNSAFE_PATH = "ComfyUIUnsafePath"  # an output name that would land outside the job's folder
UNSUPPORTED = "ComfyUIUnsupported"  # a ComfyUI that ignores the caller's prompt_id
UNAVAILABLE = "ComfyUIUnavailable"  # retryable: no answer, 5xx, or an answer that is not JSON
# Unavailable for the call's report_silence_after_s: the workflow applies the host-lost rule.
HOST_SILENT = "ComfyUIHostSilent"
# The GPU pool shows no place of the job's on the host (a reset run whose place went back, and on
# to another job, after the point it was reset to): nothing posted, the job asks again.
PLACE_TAKEN = "ComfyUIPlaceTaken"
NO_POOL = "ComfyUINoGpuPool"  # no GPU pool runs to say whose the place is: nothing was posted
# A run made by a reset found a prompt of the job's earlier run in ComfyUI (it was reset away while
# that rendered): nothing posted; the workflow takes those out (the details name them) and submits
# again.
EARLIER_RUN_HOLDS = "ComfyUIEarlierRunHolds"
INPUT_UNREADABLE = "ComfyUIInputUnreadable"  # an input image not readable where it is stored
UPLOAD_REFUSED = "ComfyUIUploadRefused"  # POST /upload/image answered 400 (or no name)
UPLOAD_SUBFOLDER = "spillway"  # inputs go to ComfyUI's input/spillway/, under content-hash names


def prompt_id_for(job_id: str, attempt: int, run_tag: str) -> str:
    """Attempt 1 is the first submit; the workflow resubmits with attempt + 1 only after LOST.
    The run's tag (spillway.core.names.run_tag) keeps a reset or re-run of a job from meeting the
    earlier run's prompt in a long-lived ComfyUI's history."""
    return f"spillway-{job_id}-{run_tag}-{attempt}"


# What follows `spillway-{job_id}-` in a prompt id: a run's tag (16 hex characters; 8 in runs of
# 0.2.0) and the attempt. Strict, so that job "a" never claims job "a-b"'s prompts.
_RUN_AND_ATTEMPT = re.compile(r"[0-9a-f]{8}(?:[0-9a-f]{8})?-[0-9]+")


def of_another_run(prompt_id: str, mine: str) -> bool:
    """Whether `prompt_id` is a prompt of the same job as `mine` (a prompt id of this run) but
    of another run of it."""
    run = mine.rpartition("-")[0]  # spillway-{job_id}-{run_tag}
    job = run.rpartition("-")[0] + "-"
    if not prompt_id.startswith(job) or of_run(prompt_id, mine):
        return False
    return _RUN_AND_ATTEMPT.fullmatch(prompt_id.removeprefix(job)) is not None


def of_run(prompt_id: str, other: str) -> bool:
    """Whether `prompt_id` is a prompt of the same run of the same job as `other`."""
    run = other.rpartition("-")[0] + "-"
    return prompt_id.startswith(run) and prompt_id.removeprefix(run).isdigit()


class HostBound(BaseModel):
    """A call that is not a wait (submit, upload, download), bounded by the host-lost rule: once
    ComfyUI has not answered it for `report_silence_after_s`, counted from `silent_since` when the
    workflow already knows of the silence, it fails with HOST_SILENT (`Silence` as its details)
    instead of retrying. None: retried for as long as it takes (a job of 0.5.0 or earlier)."""

    report_silence_after_s: float | None = None
    silent_since: datetime | None = None


class Silence(BaseModel):
    """HOST_SILENT's details."""

    silent_since: datetime
    # A submit's unanswered POST /prompt: the next submit gives it its grace before posting.
    posted_at: datetime | None = None


class ComfyUISubmit(HostBound):
    job_id: str
    prompt_id: str
    graph: dict[str, Any]  # API format: node id -> {"class_type", "inputs", ...}
    front: bool = False  # sent as "front": true: ComfyUI queues it first (priority 1 jobs)
    posted_at: datetime | None = None  # an earlier call's POST that got no answer (Silence)
    # The host of the job's place in the GPU pool (None: a job of 0.4.0, which holds no place).
    place_on: str | None = None
    # Its ask and the jobs' task queue: it posts only while the running pool of that queue shows
    # the place as the job's, for that ask (PLACE_TAKEN; NO_POOL when none runs). None: a job
    # of 0.6.0, whose place is asked about only in a run made by a reset.
    place_asked_at: datetime | None = None
    jobs_queue: str | None = None
    # The run was made by a reset: it posts only once no prompt of its earlier run is in
    # ComfyUI (EARLIER_RUN_HOLDS).
    reset_run: bool = False


class ComfyUIFit(BaseModel):
    """What a job's graph needs of a host (`capabilities.needs`: node classes, links and short
    values; a prompt's text is no list option)."""

    job_id: str
    needs: dict[str, dict[str, Any]]


class HostFit(BaseModel):
    """Whether the host can run the graph: `missing` names what it lacks (empty: it can). A host
    whose ComfyUI could not be read (`read_at` None, `error` says why) is not ruled out: the
    probe's rules decide about a host that does not answer."""

    missing: list[str] = []
    read_at: datetime | None = None
    error: str | None = None
    host: HostCapabilities | None = None  # what it has, in brief


class ComfyUISubmitted(BaseModel):
    prompt_id: str
    number: int | None = None  # ComfyUI's queue number; None when found, not posted
    posted: bool  # False: already in /queue or /history from an earlier try, not posted again


class ComfyUIUpload(HostBound):
    """One input image to put into the host's ComfyUI (activity `comfyui_upload`)."""

    job_id: str
    input: JobInput


class ComfyUIUploaded(BaseModel):
    node: str  # the loader the image is for
    name: str  # as LoadImage takes it: "spillway/<sha256>.<ext>"
    sha256: str | None = None  # of the bytes uploaded


class ComfyUIWait(BaseModel):
    job_id: str
    prompt_id: str
    # Returns "unreachable" once ComfyUI has not answered for this long, counted from
    # `silent_since` when the workflow already knows of the silence (a wait on another agent
    # process goes on counting), else from the watcher's first unanswered poll.
    report_silence_after_s: float = 30.0
    # Set when the workflow has shown the silence: the wait returns "back" at ComfyUI's next answer.
    silent_since: datetime | None = None
    # Returns "stalled" once the prompt ran without progress for the agent's RENDER_STALL_S.
    stall_rule: bool = False
    # Signals the render's progress to the job (its handler came with this field).
    relay_progress: bool = False


class ComfyUIFile(BaseModel):
    node_id: str
    kind: Literal["images", "gifs", "videos"]
    filename: str
    subfolder: str = ""
    type: str = "output"  # "temp" for previews (PreviewImage), which ComfyUI deletes on restart
    animated: bool = False  # an animation or video ("animated": [true] next to "images")


class ComfyUIFinished(BaseModel):
    """How a prompt ended. Errors and interrupts are activity failures, not outcomes:
    ApplicationError types ComfyUIExecutionFailed and ComfyUIInterrupted (non-retryable)."""

    prompt_id: str
    # lost: not in /queue and `{}` in /history; unreachable: ComfyUI silent (since
    # `silent_since`) for the wait's report_silence_after_s; back: it answers again; stalled: it
    # runs with no progress since `still_since` (still in ComfyUI: take it out).
    outcome: Literal["success", "lost", "unreachable", "back", "stalled"]
    files: list[ComfyUIFile] = []
    silent_since: datetime | None = None
    still_since: datetime | None = None
    node: str | None = None  # where it stalled
    render_s: float | None = None  # success: ComfyUI's execution_start to execution_success


class Release(BaseModel):
    """The job's place, given back to its GPU pool once the outputs are home."""

    pool_id: str
    leave: PoolLeave


class ComfyUIDownload(HostBound):
    job_id: str
    files: list[ComfyUIFile]
    # Sent by the download itself: the job then ends without waiting on a signal of its own (a
    # workflow task fewer). None: the job gives its place back itself (calls of 0.5.0).
    release: Release | None = None


class ComfyUIDownloaded(Downloaded):
    released: bool = False  # the pool has the give-back: the job holds no place any more


class ComfyUICancel(BaseModel):
    prompt_id: str
    # Every prompt of `prompt_id`'s run (`of_run`) instead: the GPU pool frees the place of a
    # run that was reset away from it once ComfyUI holds none of that run's prompts.
    whole_run: bool = False


class ComfyUICancelled(BaseModel):
    prompt_id: str
    was: Literal["pending", "running", "gone"]
    taken_out: list[str] = []  # with `whole_run`: the prompts that were taken out
