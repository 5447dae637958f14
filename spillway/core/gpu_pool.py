"""What the GPU pool and the jobs tell each other, what the pool carries across continue-as-new,
and what `spillway queue` shows of it (docs/design.md, "GPU admission"). The book that applies
them is spillway/core/pool_book.py.

A job is known by its id and the moment it asked (`asked_at`): an answer or a give-back for an
earlier ask of the same job changes nothing of a later one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer

from spillway.core.fair_share import Turns
from spillway.core.models import HostCapabilities, HostRef, JobState
from spillway.core.models import PlaceMode as Mode

MAX_MODELS = 16  # model files per ask: a graph loads a handful


# What one message may carry: a signal over these is dropped whole (the SDK drops a signal
# whose input does not decode), so whatever arrives the pool's carried state stays small.
MAX_ID = 255  # job ids are at most 100 characters (spillway.core.models.JobId)
MAX_HOSTS_SEEN = 64
MAX_SHAPE = 16  # a graph's shape: a short hash (activities/comfyui/capabilities.graph_shape)
MAX_SHAPES = 32  # shapes whose recent renders the pool keeps


class HostSeen(BaseModel):
    """One host as the asking job's own probe found it."""

    name: Annotated[str, Field(max_length=MAX_ID)]
    reachable: bool
    headroom: bool
    capabilities: HostCapabilities | None = None  # what it can run, as its agent last read it


class PoolAsk(BaseModel):
    job_id: Annotated[str, Field(min_length=1, max_length=MAX_ID)]
    asked_at: datetime
    priority: Annotated[int, Field(ge=1, le=5)] = 3
    mode: Mode = "any"
    wait: bool = True  # False: a place now or the answer "full" (an armed job goes to the cloud)
    # the job's probe, hosts in the order it prefers them
    seen: Annotated[list[HostSeen], Field(max_length=MAX_HOSTS_SEEN)] = []
    # A job in line checking that the pool still has its ask: answered only when it had not.
    again: bool = False
    # The places per host in the policy the job read: other than the pool's, the pool reads the
    # workers' policy anew (a deploy changed A40_MAX_JOBS or the hosts), never taking these.
    places: Annotated[dict[str, int], Field(max_length=MAX_HOSTS_SEEN)] = {}
    # The asking run: a holder check that finds another run of the job (a reset) takes that
    # run's prompts out of ComfyUI before the place is free.
    run_id: Annotated[str, Field(max_length=MAX_ID)] | None = None
    # The hosts known to lack what the job's graph needs (a node class, a model file): it is
    # never admitted there, and waits in line for the others. A host added since it asked is not
    # among them.
    unfit: Annotated[
        list[Annotated[str, Field(max_length=MAX_ID)]], Field(max_length=MAX_HOSTS_SEEN)
    ] = []
    # The model files its graph loads (sorted): a host that loaded them last has them warm.
    models: Annotated[
        list[Annotated[str, Field(max_length=MAX_ID)]], Field(max_length=MAX_MODELS)
    ] = []
    # In line: how often a job whose models were warm went ahead of it (WARM_PASSES at most).
    passed: Annotated[int, Field(ge=0)] = 0
    # An armed job waiting by its patience: the latest start it waits for. The pool tells it
    # once the line's estimate says it would start later (`PoolAnswer.late`); it leaves for the
    # cloud. `by_deadline`: `start_by` is its deadline, and a typical render must fit before it.
    start_by: datetime | None = None
    by_deadline: bool = False
    told_late: bool = False  # in line: it was told
    # What kind of render its graph is: the line's estimate takes renders of the same shape
    # where the pool has seen some (None: any render).
    shape: Annotated[str, Field(max_length=MAX_SHAPE)] | None = None
    # Who the job is for (SPILLWAY_TEAMS_FILE): places go to teams by their shares. None: the
    # default team (an ask of a job before teams).
    team: Annotated[str, Field(max_length=MAX_ID)] | None = None
    # The job whose preemption sent this one back into line (SPILLWAY_PREEMPT): it is never
    # preempted again, and its earlier place must be free before this ask is lined.
    preempted_by: Annotated[str, Field(max_length=MAX_ID)] | None = None

    @model_serializer(mode="wrap")
    def _without_defaults(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Fields at their defaults are left out (they read back as those): the line the pool
        carries across continue-as-new stays well under Temporal's payload warning."""
        data: dict[str, Any] = handler(self)
        fields = type(self).model_fields
        return {k: v for k, v in data.items() if k not in fields or v != fields[k].default}


class PoolDrain(BaseModel):
    """`spillway host drain|resume`: no new places on `host` (those held finish), or again."""

    host: Annotated[str, Field(min_length=1, max_length=MAX_ID)]
    drain: bool
    by: Annotated[str, Field(min_length=1, max_length=MAX_ID)]
    reason: Annotated[str, Field(max_length=500)] = ""


class Drain(BaseModel):
    by: str
    since: datetime
    reason: str = ""


class PoolPlaces(BaseModel):
    """A worker that started: the places per host its policy has."""

    places: Annotated[dict[str, int], Field(max_length=MAX_HOSTS_SEEN)]


class PoolLeave(BaseModel):
    """A job gives its place back, or leaves the line."""

    job_id: Annotated[str, Field(min_length=1, max_length=MAX_ID)]
    asked_at: datetime
    # A prompt ComfyUI may still hold (the job left its host without knowing it let go): the
    # place stays held until the pool has taken it out.
    prompt_id: Annotated[str, Field(max_length=MAX_ID)] | None = None
    # How long its render took by ComfyUI's own clock: what the ETA learns from.
    render_s: Annotated[float, Field(ge=0, le=7 * 86400)] | None = None


class PoolAnswer(BaseModel):
    """To the job: admitted on `host`; or `position` in the line; or neither (full, not lined).
    `full` names each host whose places were all taken."""

    asked_at: datetime
    host: str | None = None
    position: int | None = None
    full: list[str] = []
    eta_s: float | None = None  # in the line: the estimate of when it starts (None: not known)
    render_s: float | None = None  # a typical render here (the median of the recent ones)
    # In the line, waiting by its patience: the estimate says it would start after `start_by`.
    late: bool = False
    # Not lined (full, and the ask does not wait): the position it would have had (its quote).
    would_be: int | None = None
    # Not lined: its team has as many jobs waiting as its `max_waiting` (the words say so).
    refused: str | None = None
    # In the line, where the pool has several teams: the places its team held then.
    team_places: int | None = None
    # To a holder (SPILLWAY_PREEMPT): give this place back to that job. The holder takes its
    # prompt out of ComfyUI first, then gives the place back and asks again at its first ask
    # time; the place goes to that job once free.
    preempted_by: str | None = None


Sent = tuple[str, PoolAnswer]  # (job id, answer): what the pool signals


class LateCheck(BaseModel):
    """The pool's word on a job's own ask (its `late` query), which the job leaves the line for
    the cloud on, never on an answer's: whether the pool has that very ask in line and, with the
    job's own patience, the line's estimate puts its start past it."""

    lined: bool = False
    position: int | None = None
    eta_s: float | None = None
    late: bool = False


class Quoted(BaseModel):
    """Where an ask would stand if it came now: a place on `host`, or `position` in the line
    with its ETA; `full` as an answer would name them."""

    host: str | None = None
    position: int = 0
    eta_s: float | None = None
    full: list[str] = []
    render_s: float | None = None  # a typical render here


class Holder(BaseModel):
    job_id: str
    asked_at: datetime
    host: str
    run_id: str | None = None  # the run admitted (None: not known)
    since: datetime
    checked_at: datetime
    # The job has left; its place is free once this prompt is out of the host's ComfyUI.
    clearing: str | None = None
    # Instead: once no prompt of the run `clearing` names is (that run was reset away from the
    # place while it rendered).
    clearing_run: bool = False
    cleared_at: datetime | None = None  # the last try
    # A give-back in the job's name, not yet confirmed by the job itself (the holder check asks
    # it): when it came, the prompt it named, whether a check has begun since, and the checks
    # that found the job still holding (or could not ask it).
    left_at: datetime | None = None
    left_prompt: str | None = None
    leave_unchecked: bool = False
    left_checks: int = 0
    left_render_s: float | None = None
    adopted: bool = False  # from an earlier pool: when it took its place is not known
    shape: str | None = None  # its graph's (PoolAsk.shape)
    team: str | None = None  # who it is for (PoolAsk.team; None: the default team)
    # Its host's ComfyUI (HostRef.comfyui) when admitted: the host renamed since, its place
    # counts on the host of that ComfyUI under its new name.
    comfyui: str | None = None
    priority: int = 3  # its ask's (the preemption rule reads it)
    preempted: bool = False  # it was preempted once: never again
    # Preemption under way: the job its place goes to once the holder has let go, and when
    # the holder was told.
    preempted_by: str | None = None
    preempted_at: datetime | None = None


class HeldPlace(BaseModel):
    """A place as the pool's memo shows it (names.POOL_HOLDERS_MEMO): the pool's own word on who
    holds what. A job's submit reads it before it posts (an answer may be anyone's signal), and
    a pool that starts after this one ended reads it to find the holders that ended meanwhile
    and to count no place a job claims that this pool had taken back."""

    asked_at: datetime
    host: str
    run_id: str | None = None


class Reading(BaseModel):
    reachable: bool
    headroom: bool
    at: datetime


class PoolHost(BaseModel):
    ref: HostRef
    max_jobs: int


class PoolQuote(BaseModel):
    """`pool_quote`: the ask a job would send, and the hosts in force (for a pool that is not
    running: every place is free)."""

    ask: PoolAsk
    hosts: list[PoolHost]


class Message(BaseModel):
    """An ask or a give-back the pool received and has not applied yet."""

    ask: PoolAsk | None = None
    leave: PoolLeave | None = None
    drain: PoolDrain | None = None


class PoolInput(BaseModel):
    """What the pool carries across continue-as-new: the book, and the messages that arrived
    while it was ending its run (applied first by the next)."""

    inbox: list[Message] = []
    holders: list[Holder] = []
    line: list[PoolAsk] = []
    readings: dict[str, Reading] = {}
    holds_s: dict[str, list[float]] = {}  # recent hold durations per host, newest last
    # The same per graph shape (PoolAsk.shape), the MAX_SHAPES renewed last.
    shape_holds: dict[str, list[float]] = {}
    # Asks naming a holder with another ask time, until the holder check says whether that job
    # still holds its place (then the ask is dropped) or not (its run was reset: asked anew).
    parked: list[PoolAsk] = []
    # Temporal takes 10,000 signals per run at most, and a short history is quick to replay.
    signals_per_run: int = 500
    # False: a first run, or one started after an earlier pool ended: it asks the running jobs
    # which places they hold before it hands out any.
    continued: bool = False
    warm: dict[str, list[str]] = {}  # per host, the model files the job admitted last loads
    capabilities: dict[str, HostCapabilities] = {}  # per host, the latest a job brought
    drained: dict[str, Drain] = {}  # hosts given no new places (`spillway host drain`)
    # The hosts in force, so that a continued run shows them before it has read the policy.
    hosts: list[PoolHost] = []
    # Asks that repeat a lined job's ask time with another mode or priority: applied only once
    # the job's own place says the same (a message in its name changes nothing it did not ask).
    changing: list[PoolAsk] = []
    # Each team's turn for a freed place (spillway/core/fair_share.py).
    turns: Turns = Turns()
    # Preemption: per preemptor, the host whose place its victim has let go of, kept for it
    # until it takes it or leaves the line; and how many the pool has made.
    promised: dict[str, str] = {}
    preemptions: int = 0


class PlaceView(BaseModel):
    job_id: str
    since: datetime
    # The job has left; the place is free once this prompt is out of ComfyUI (its host may not
    # answer yet).
    clearing: str | None = None
    # The holder's own state, as `spillway queue` reads it off Temporal (the pool does not keep
    # it); None where it was not read.
    state: JobState | None = None
    team: str | None = None
    preempted_by: str | None = None  # it is giving its place to that job (SPILLWAY_PREEMPT)


class HostPlaces(BaseModel):
    name: str
    max_jobs: int
    places: list[PlaceView]
    reachable: bool | None  # as last seen; None: not yet seen
    headroom: bool | None
    # What it can run, as the latest job to ask found it; None: no job brought it yet.
    capabilities: HostCapabilities | None = None
    drained: Drain | None = None  # given no new places, by whom, since when, why
    # The model files the job admitted there last loads: warm in its ComfyUI (the console shows
    # them; SPILLWAY_POOL_PREFER_WARM prefers them).
    warm: list[str] = []

    def drained_text(self) -> str:
        d = self.drained
        if d is None:
            return ""
        why = f": {d.reason}" if d.reason else ""
        return f", drained by {d.by} since {d.since:%Y-%m-%d %H:%M} UTC{why}"


class InLine(BaseModel):
    job_id: str
    priority: int
    since: datetime
    mode: Mode
    position: int
    eta_s: float | None
    # A job that waits for headroom is also waiting for a person (approve: the cloud).
    state: JobState = "queued"
    why: str = ""  # what it waits for, in a few words
    # An armed job waiting by its patience goes to the cloud then (read off the job's plan by
    # `spillway queue`; the pool does not keep it).
    patience_until: datetime | None = None
    team: str | None = None
    preempted_by: str | None = None  # sent back into line by that job's preemption


class PoolView(BaseModel):
    """`spillway queue --json` (docs/schema/queue.json)."""

    hosts: list[HostPlaces]
    line: list[InLine]
    # not_started: no job has asked yet; closed: its latest run ended (`closed` says how, e.g.
    # TERMINATED) and what it last held is not shown: the jobs ask a new pool.
    pool: Literal["running", "not_started", "closed"] = "running"
    closed: str | None = None
    preemptions: int = 0  # places taken by preemption since the pool started (SPILLWAY_PREEMPT)
