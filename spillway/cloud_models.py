"""The one shape of every cloud provider (MiniMax, Kling): what the workflow sends and gets back
from a provider's create, poll and download activities, and what a provider's create answer
proves (money invariant 2: each provider reads its answer into a `CreateVerdict` with a pure,
table-tested function, and the activity acts on the verdict alone).

No model here ever holds a key: the activities read keys from the worker's settings. `provider`
defaults to "minimax" because jobs from before Kling carry no provider in their history.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel

from spillway.kling_requests import Kind
from spillway.models import CloudRequest, JobId, JobInput
from spillway.spend_models import Authorisation

Provider = Literal["minimax", "kling"]

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
    # The default is the strictest reading, for creates scheduled before the field existed.
    authorisation: Authorisation = "armed"
    simulated: bool = False  # the job was decided by a simulated worker (spillway dev --simulate)
    provider: Provider = "minimax"
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
    """A Kling create whose worker was lost before it answered: what `kling_reconcile` asks
    Kling about, by the external_task_id of the run that sent it."""

    job_id: JobId
    kind: Kind  # the create's (`kind_of`): Kling's query path names it
    # The run that began the create (the ledger's `run_id`): a reset job runs on under another
    # run id, and the create carried the id of the run that sent it.
    run_id: str
    # When its first request was about to leave (the ledger's `sent_at`): every request of it
    # has ended within the longest a create runs from then.
    sent_at: datetime


class Reconciled(BaseModel):
    external_task_id: str
    task_id: str | None = None  # the task Kling made for it; None: none once none could land


class CloudPoll(BaseModel):
    job_id: JobId
    task_id: str
    provider: Provider = "minimax"


class CloudDone(BaseModel):
    task_id: str
    file_id: str | None = None  # MiniMax: the file to retrieve
    video_url: str | None = None  # Kling: where the video is (no key goes there)
    video_width: int | None = None
    video_height: int | None = None
    cost_usd: float | None = None  # the provider's own figure, when it gives one
    units: float | None = None  # Kling: resource-pack units the task used (not dollars)


class CloudDownload(BaseModel):
    job_id: JobId
    task_id: str
    file_id: str | None = None
    video_url: str | None = None
    provider: Provider = "minimax"


class SpendRequest(BaseModel):
    """Input of `spend_reserve`: the activity adds the run id, the estimate and the budgets in
    force on the worker at that moment."""

    job_id: str
    provider: str
    resolution: str
    duration: int
    # The whole request (jobs since Kling): a provider's estimate may depend on more of it.
    request: CloudRequest | None = None
    authorised_by: str
    authorisation: Authorisation
