"""Every name spillway puts on the wire: workflow types, their signals, updates and queries, the
memo keys a job publishes, the spend ledger's workflow id, and the activities of the systems
that are not a cloud provider (each provider names its own, in its folder). Running jobs'
histories hold these names: renaming one breaks them (the replay test says so)."""

from __future__ import annotations

import hashlib


def run_tag(run_id: str) -> str:
    """What tells one workflow run's ids (prompt ids, Kling's external_task_id, callback ids) from
    another run's of the same job. Not the run id's start: Temporal's run ids are UUIDv7, whose
    first 8 characters are a timestamp shared by runs about a minute apart."""
    return hashlib.sha256(run_id.encode()).hexdigest()[:16]


# --- workflows ---------------------------------------------------------------------------------

VIDEO_JOB = "VideoJobWorkflow"  # what clients start: its input is the JSON of VideoJob
SPEND_LEDGER = "SpendLedgerWorkflow"
HEALTH = "SpillwayHealthWorkflow"
QUOTE = "SpillwayQuoteWorkflow"
CALLBACK = "SpillwayCallbackWorkflow"
GPU_POOL = "SpillwayGpuPoolWorkflow"

# VideoJobWorkflow's handlers. The signal takes a raw payload (read in the handler) and the
# update is async, so the SDK cannot type calls made with the methods themselves.
APPROVAL_SIGNAL = "approval"
DECIDE_UPDATE = "decide_approval"
PRIORITY_UPDATE = "set_priority"  # `spillway priority JOB N`
CANCEL_NOTE_SIGNAL = "cancel_note"  # `spillway cancel JOB --by WHO`, before the cancel itself
RENDER_PROGRESS_SIGNAL = "render_progress"  # from the ComfyUI wait, for the UI's details
PLAN_QUERY = "plan"
POOL_ANSWER = "pool_answer"  # the GPU pool's answer to the job's ask: a place, or a position
JOB_PLACE = "pool_place"  # the job's own account of its place, for the pool's holder check
# The memo keys a job publishes: its plan (`spillway status` without a worker) and its priority
# (`list`: Temporal's list does not return an execution's priority).
PLAN_MEMO = "plan"
PRIORITY_MEMO = "priority"

# The spend ledger's handlers.
LEDGER_RESERVE = "reserve"
LEDGER_BEGIN = "begin"
LEDGER_SETTLE = "settle"
LEDGER_CONFIGURE = "configure"
LEDGER_SUMMARY = "summary"
LEDGER_BUDGETS = "budgets"
LEDGER_MONTH = "month_spent"
LEDGER_CREATED = "created_before"
LEDGER_RESET_FROM = "reset_from"
LEDGER_VET = "spend_ledger_vet_batch"  # the ledger's own activity, one per inbox batch
LEDGER_ID = "spillway-spend-ledger"

# The GPU pool's handlers (docs/design.md, "GPU admission"): jobs reach it by signal-with-start,
# which hundreds of jobs arriving at once cannot overrun (updates: 10 in flight at most).
POOL_ASK = "ask"
POOL_LEAVE = "give_back"
POOL_VIEW = "view"
POOL_POLICY = "policy"  # a worker that started tells the pool its places: read anew if other
POOL_SPOT = "spot"
POOL_DRAIN = "drain"  # `spillway host drain|resume`
POOL_QUOTE = "quote"  # where an ask would stand now (`spillway quote`)
POOL_LATE = "late"  # whether a job's own ask is late by the line's estimate (`LateCheck`)
POOL_DRAINED_MEMO = "drained"  # the pool's drains, read by the pool that starts after it ended
# Who holds which place, by the pool's own word: a key per holder (`HeldPlace`), each upsert
# only what changed (Temporal's SDK warns of a memo upsert over 2 KB: 20 holders); `holders`
# says the pool keeps them (a pool of 0.6.0 does not).
POOL_HOLDERS_MEMO = "holders"
POOL_HOLDER_MEMO = "holder:"


def holder_memo(job_id: str) -> str:
    return POOL_HOLDER_MEMO + job_id


POOL_ID = "spillway-gpu-pool"


def ledger_id(task_queue: str) -> str:
    """One ledger per namespace and task queue: a simulated deployment (its own queue) never
    shares money with the real one."""
    return LEDGER_ID if task_queue == "spillway" else f"{LEDGER_ID}-{task_queue}"


def pool_id(task_queue: str) -> str:
    """One GPU pool per namespace and task queue, like the ledger."""
    return POOL_ID if task_queue == "spillway" else f"{POOL_ID}-{task_queue}"


VET_SUFFIX = "-ledger-vet"


def vet_queue(task_queue: str) -> str:
    """The spend ledger's vetting queue, served by a worker of its own in the worker's process:
    a burst of jobs' activities on the main queue never holds up the ledger's answers."""
    return task_queue + VET_SUFFIX


POOL_SUFFIX = "-gpu-pool"


def pool_queue(task_queue: str) -> str:
    """The pool's own task queue, served by a worker of its own in the worker's process: its
    cache never gives the pool's place to a burst of jobs (a pool evicted under a burst replays
    its whole history for every batch of asks)."""
    return task_queue + POOL_SUFFIX


# --- activities --------------------------------------------------------------------------------

READ_POLICY = "read_policy"
PROBE = "a40_load_status"  # the seed's name
NOTIFY_APPROVAL = "notify_approval_needed"
APPROVAL_VERIFY = "approval_verify"
JOB_CALLBACK = "job_callback"

COMFYUI_SUBMIT = "comfyui_submit"
COMFYUI_WAIT = "comfyui_wait"
COMFYUI_DOWNLOAD = "comfyui_download"
COMFYUI_CANCEL = "comfyui_cancel"
COMFYUI_UPLOAD = "comfyui_upload"
COMFYUI_FIT = "comfyui_fit"  # whether the host can run a graph (its node classes, its options)

SPEND_RESERVE = "spend_reserve"
SPEND_SETTLE = "spend_settle"
SPEND_VIEW = "spend_view"
SPEND_RECORDED = "spend_recorded"

POOL_START = "gpu_pool_start"
POOL_CHECK = "gpu_pool_check_holders"
POOL_FIND = "gpu_pool_find_holders"
POOL_QUOTE_ACTIVITY = "gpu_pool_quote"
POOL_LATE_ACTIVITY = "gpu_pool_confirm_late"
POOL_START_BY_LEAVE = "gpu_pool_start_by_leave"
POOL_READ_PLACES = "gpu_pool_read_places"
