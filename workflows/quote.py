"""QuoteWorkflow: what `spillway quote` asks the workers (docs/design.md, "Quotes"): the route a
job would take now, under the rules a job applies at its first decision, with nothing started:
no ask reaches the GPU pool (its `quote` query answers where the ask would stand), no place is
taken, nothing is reserved. Workflow code."""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.common import Priority
from temporalio.exceptions import ActivityError, ApplicationError

from workflows import activity_calls as calls
from workflows.measure import agent_silence

with workflow.unsafe.imports_passed_through():
    from activities.comfyui.capabilities import graph_shape
    from activities.comfyui.models import HostFit
    from activities.spend.activities import SpendRequest
    from spillway.core import names
    from spillway.core.decision import Line, Seen, is_armed, patience_s, route
    from spillway.core.gpu_pool import HostSeen, PoolAsk, PoolHost, PoolQuote
    from spillway.core.hosts import no_answer, pick_host
    from spillway.core.ledger import BudgetView
    from spillway.core.models import (
        CloudQuote,
        HostRef,
        LoadStatus,
        Policy,
        Quote,
        VideoJob,
    )
    from workflows import texts

QUOTE = "quote"  # the job id its probes and policy read carry
NO_HOST = "NoHostCanRun"
NO_TEAM = "NoSuchTeam"


@workflow.defn(name=names.QUOTE)
class QuoteWorkflow:
    @workflow.run
    async def run(self, job: VideoJob) -> Quote:
        policy = await calls.read_policy(QUOTE)
        team = job.team or policy.default_team
        if policy.team_shares and team not in policy.team_shares:  # the job would fail so
            raise ApplicationError(texts.no_such_team(team, list(policy.team_shares)), type=NO_TEAM)
        priority = Priority(priority_key=job.priority)
        loads, fits = await asyncio.gather(
            asyncio.gather(*(_probe(policy, h, priority) for h in policy.hosts)),
            asyncio.gather(*(_fit(job, h, priority) for h in policy.hosts)),
        )
        unfit = [h.name for h, fit in zip(policy.hosts, fits, strict=True) if fit.missing]
        if policy.hosts and len(unfit) == len(policy.hosts):
            missing = {h.name: fit.missing for h, fit in zip(policy.hosts, fits, strict=True)}
            raise ApplicationError(texts.no_host_can_run(missing), type=NO_HOST)
        readings = {h.name: load for h, load in zip(policy.hosts, loads, strict=True)}
        load = pick_host({n: r for n, r in readings.items() if n not in unfit}).load
        armed = is_armed(policy.fallback_enabled, policy.key_present, job.cloud is not None)
        mode = "any" if job.cloud is None else "headroom"
        ask = PoolAsk(
            job_id=job.job_id,
            asked_at=workflow.now(),
            priority=job.priority,
            mode=mode,
            seen=[
                HostSeen(name=n, reachable=r.reachable, headroom=r.reachable and not r.overloaded)
                for n, r in readings.items()
            ],
            unfit=unfit,
            shape=graph_shape(job.graph),
            team=team,
        )
        hosts = [PoolHost(ref=h, max_jobs=h.max_jobs) for h in policy.hosts]
        line = await calls.pool_quote(PoolQuote(ask=ask, hosts=hosts))
        provider, view = await _budget(job, policy)
        # The rules a job decides by, over what was read here: the route and its why are the
        # ones the job would show, budget_exhausted included.
        verdict = route(
            Seen(
                load=load,
                armed=armed,
                has_cloud=job.cloud is not None,
                hosts=tuple(h.name for h in policy.hosts),
                unfit=tuple(unfit),
                line=Line(
                    host=line.host,
                    position=line.position,
                    eta_s=line.eta_s,
                    render_s=line.render_s,
                    full=line.full,
                ),
                patience_s=(
                    patience_s(job, policy.overflow_after_s, workflow.now()) if armed else None
                ),
                by_deadline=job.deadline is not None,
                budget=view,
            )
        )
        return Quote(
            local=verdict.local,
            cloud=None if provider is None else CloudQuote.of(provider, view),
            route=verdict.quote,
            why=verdict.why,
        )


async def _probe(policy: Policy, host: HostRef, priority: Priority) -> LoadStatus:
    try:
        return await calls.probe(QUOTE, host, priority)
    except ActivityError as err:
        return no_answer(host.name, policy.thresholds, workflow.now(), agent_silence(err))


async def _fit(job: VideoJob, host: HostRef, priority: Priority) -> HostFit:
    try:
        return await calls.comfyui_fit(QUOTE, host, job.graph, priority)
    except ActivityError as err:
        return HostFit(error=agent_silence(err))


async def _budget(job: VideoJob, policy: Policy) -> tuple[str | None, BudgetView | None]:
    """The first provider and its budget view: the estimate for the clip and what the budgets
    have left (None: the view failed). No provider when the job has no cloud prompt or the
    workers hold no cloud key."""
    if job.cloud is None or not policy.providers:
        return None, None
    provider = policy.providers[0]
    request = SpendRequest(
        job_id=job.job_id,
        provider=provider,
        request=job.cloud,
        authorised_by="quote",
        authorisation="armed",
    )
    try:
        return provider, await calls.spend_view(request)
    except ActivityError as err:  # the quote goes on: the ledger checks when a job reserves
        workflow.logger.warning("quote: budget view failed: %s", err.cause or err)
        return provider, None
