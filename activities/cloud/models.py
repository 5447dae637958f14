"""What the workflow sends to and gets back from every cloud provider's activities (create,
poll, download, reconcile), and what a provider's create answer proves (money invariant 2: each
provider reads its answer into a `CreateVerdict` with a pure, table-tested function, and the
activity acts on the verdict alone). `provider` is a `CloudProvider.name`.

No model here ever holds a key: the activities read keys from the worker's settings.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel

from spillway.core.ledger import Authorisation, Usd
from spillway.core.models import CloudRequest, JobId, JobInput

CreateOutcome = Literal["created", "retry", "refused", "ambiguous"]


class CreateVerdict(BaseModel):
    """- `created`: a task exists (`task_id`); record it at once.
    - `retry`: the provider provably made nothing and says "later" (rate, volume): send again
      after a backoff (`rate_limited` asks for a longer one).
    - `refused`: the provider provably made nothing and will not for this request or account
      (auth, balance, quota, parameters): the next provider may take the job.
    - `ambiguous`: a task, and a charge, may exist. Never send the same create again unless the
      provider can be asked whether the task exists (an idempotency key).
    """

    outcome: CreateOutcome
    task_id: str | None = None
    code: int | None = None
    message: str = ""  # the provider's own words, never a key
    rate_limited: bool = False
    sent_at: datetime | None = None  # when the (last) request left: the time to look for
    attempts: int = 1  # requests sent; all but the last were provably refused


class CloudCreate(BaseModel):
    # JobId's pattern also keeps the job's output folder inside SPILLWAY_OUTPUT_DIR.
    job_id: JobId
    request: CloudRequest
    # Who allowed the spending; "armed" is checked against the worker's settings at the create.
    authorisation: Authorisation
    simulated: bool = False  # the job was decided by a simulated worker (spillway dev --simulate)
    # The job's first input image, the first frame of an image-to-video clip: the activity
    # reads it from where it is stored (its bytes never travel in history).
    first_frame: JobInput | None = None


class CloudCreated(BaseModel):
    task_id: str
    # When the provider accepted the task (UTC) and how many create requests it took: every
    # request before the last one was answered with an explicit "no", so none made a task.
    created_at: datetime | None = None
    create_calls: int = 1
    # False when the spend ledger did not take the task id: the workflow records it again.
    settled: bool = True


class LostCreate(BaseModel):
    """A create whose worker was lost before it answered: what a provider that reconciles
    (`CloudProvider.reconciles`) is asked about, by the id the create carried."""

    job_id: JobId
    # What was created: a provider's query may depend on it (Kling's path names the kind).
    request: CloudRequest
    first_frame: bool
    # The run that began the create (the ledger's `run_id`): a reset job runs on under another
    # run id, and the create carried the id of the run that sent it.
    run_id: str
    # When its first request was about to leave (the ledger's `sent_at`): every request of it
    # has ended within the longest a create runs from then.
    sent_at: datetime


class Reconciled(BaseModel):
    external_task_id: str  # the id the create carried, by which the provider was asked
    task_id: str | None = None  # the task it made; None: none once none of its requests could land


class CloudPoll(BaseModel):
    job_id: JobId
    task_id: str


class CloudDone(BaseModel):
    task_id: str
    file_id: str | None = None  # a file the provider retrieves (MiniMax)
    video_url: str | None = None  # where the video is (Kling; no key goes there)
    video_width: int | None = None
    video_height: int | None = None
    cost_usd: Usd | None = None  # the provider's own figure, when it gives one
    units: float | None = None  # what the task used in the provider's own units (not dollars)


class CloudDownload(BaseModel):
    job_id: JobId
    task_id: str
    file_id: str | None = None
    video_url: str | None = None
