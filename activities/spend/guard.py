"""The guard every provider's create runs its one request inside (docs/design.md, "Money
invariants"): the right world (a simulated job never meets a real key), armed checked against
the worker's settings NOW, `begin` in the spend ledger right before the request leaves (only one
create per reservation ever begins, whatever resets or re-runs happened), and the outcome
recorded the moment it is known."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.cloud.models import CreateVerdict
from activities.spend.ledger import Ledger
from spillway.core import names
from spillway.core.ledger import Authorisation, BeginCreate, SettleRequest, SpendEntry
from spillway.core.models import Progress
from spillway.core.settings import Settings
from spillway.core.spend_book import REFUSED, SpendRefused, token_of

NOT_ARMED = "SpendNotArmed"
WRONG_WORLD = "SpendWrongWorld"


Send = Callable[[], Awaitable[CreateVerdict]]


class Beginning(Progress):
    """A create attempt's heartbeat details from its first beat: the hash of the nonce it
    begins with. Only the attempt's worker can heartbeat it (Temporal's trust boundary), so the
    ledger's vet believes a begin only with this token: someone who read the attempt off
    Temporal cannot begin it first with a token of their own."""

    token: str


@dataclass(frozen=True)
class CreatedOnce:
    verdict: CreateVerdict
    settled: bool  # False: the ledger did not take the outcome; the workflow records it again
    # The attempt's nonce, given up only with a provable refusal the ledger did not take: the
    # workflow frees the entry with it (a task that exists is never freed by anyone but this
    # attempt, so its nonce never leaves it).
    release: str = ""


class CreateGuard:
    """What every provider's create activity runs its one request inside."""

    def __init__(self, ledger: Ledger, settings: Settings) -> None:
        self.ledger, self._settings = ledger, settings

    async def create(
        self, job_id: str, authorisation: Authorisation, simulated: bool, send: Send, nonce: str
    ) -> CreatedOnce:
        """`nonce`: the attempt's own, its hash already in its heartbeat (`Beginning`)."""
        if simulated != self._settings.SPILLWAY_SIMULATED:
            kinds = ("a simulated", "a real") if simulated else ("a real", "a simulated")
            raise ApplicationError(
                f"job {job_id} was decided by {kinds[0]} worker and its create reached "
                f"{kinds[1]} one (do `spillway dev --simulate` and a real worker share a task "
                "queue?): nothing was sent",
                type=WRONG_WORLD,
                non_retryable=True,
            )
        # The provider checked its own keys before: armed is the switch, as it is now.
        if authorisation == "armed" and not self._settings.CLOUD_VIDEO_FALLBACK_ENABLED:
            raise ApplicationError(
                "the cloud fallback is not armed on this worker any more: nothing was sent",
                type=NOT_ARMED,
                non_retryable=True,
            )
        info = activity.info()
        if info.workflow_type != names.VIDEO_JOB or info.workflow_id != job_id:
            # Temporal, not the request, says who scheduled this: another workflow (even one
            # named like ours; the ledger checks its task queue) never spends.
            raise ApplicationError(
                f"a create for job {job_id} was asked by workflow {info.workflow_id} "
                f"({info.workflow_type}), not by that spillway job: nothing was sent",
                type=REFUSED,
                non_retryable=True,
            )
        run_id = info.workflow_run_id or ""
        attempt = f"{run_id}/{info.activity_id}/{info.attempt}"
        # Held by this attempt alone until it settles: a begun entry is freed, charged or
        # re-priced only by whoever shows it (the ledger keeps its hash).
        begin = BeginCreate(job_id=job_id, run_id=run_id, attempt=attempt, token=token_of(nonce))
        try:
            await self.ledger.check_home()
            await self.ledger.begin(begin)
        except SpendRefused as refused:
            raise ApplicationError(
                f"{refused.message}: nothing was sent",
                {"kind": refused.kind, "entry": _dump(refused.entry)},
                type=REFUSED,
                non_retryable=True,
            ) from None
        except ApplicationError as err:
            raise ApplicationError(err.message, type=err.type, non_retryable=True) from None
        verdict = await send()
        state = {"created": "charged", "refused": "refused", "ambiguous": "maybe_charged"}
        settle = SettleRequest(
            job_id=job_id,
            run_id=run_id,
            state=state[verdict.outcome],
            task_id=verdict.task_id,
            note=verdict.message[:300],
            nonce=nonce,
        )
        try:
            await self.ledger.settle(settle)
            settled = True
        except (SpendRefused, ApplicationError) as exc:
            # The workflow settles again from history; until then the entry blocks any second
            # create for this job, which is the safe side.
            activity.logger.warning("spend ledger: settling job %s failed: %s", job_id, exc)
            settled = False
        release = nonce if verdict.outcome == "refused" and not settled else ""
        return CreatedOnce(verdict=verdict, settled=settled, release=release)


def _dump(entry: SpendEntry | None) -> object:
    return entry.model_dump(mode="json") if entry else None
