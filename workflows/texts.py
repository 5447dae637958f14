"""What VideoJobWorkflow tells people: current details for the Temporal UI, the approval notice,
failure messages. Pure string building (deterministic), kept apart so the workflow reads as flow."""

from __future__ import annotations

from datetime import datetime, timedelta

from activities.cloud.models import Reconciled
from activities.cloud.registry import console, key_names, label
from spillway.core.decision import BUDGET_EXHAUSTED, Decision, about, duration, ordinal
from spillway.core.gpu_pool import PlaceView, PoolView
from spillway.core.ledger import BudgetShortfall, BudgetView, SpendEntry
from spillway.core.models import (
    ApprovalNotice,
    CloudAttempt,
    Plan,
    Policy,
    RenderProgress,
)
from spillway.core.spend_book import describe


def no_such_team(team: str, teams: list[str]) -> str:
    return f"no team {team!r}; the teams: {', '.join(sorted(teams))} (SPILLWAY_TEAMS_FILE)"


def check(provider: str) -> str:
    return (
        f"check {console(provider)} for a task created at that time before resubmitting; "
        "spillway will not create again for this job"
    )


def _where(plan: Plan) -> str:
    """The GPU host (or hosts) the latest reading is of, as people name them."""
    signal = plan.overflow.last_signal
    if signal is not None and signal.hosts:
        return f"every GPU host ({', '.join(signal.hosts)})"
    if signal is not None and signal.host:
        return f"GPU host {signal.host}"
    return "the GPU"


def _signal_text(plan: Plan) -> str:
    signal = plan.overflow.last_signal
    if signal is None:
        return ""
    if not signal.reachable:
        return f"ComfyUI did not answer (as of {signal.measured_at:%H:%M:%S} UTC)"
    reasons = ", ".join(signal.reasons) or "no load reason"
    return f"{reasons} (measured {signal.measured_at:%H:%M:%S} UTC)"


def commands(job_id: str) -> tuple[str, str]:
    return (
        f"spillway approve {job_id} --by NAME --reason TEXT",
        f"spillway reject {job_id} --by NAME --reason TEXT",
    )


def current_details(plan: Plan, progress: RenderProgress | None = None) -> str:
    """Markdown for the Temporal UI's "Current details": what the job waits for and why, and
    while it renders locally, how far its prompt is (`progress`, as its wait last relayed it)."""
    state = plan.state
    if state == "awaiting_approval":
        approve, reject = commands(plan.job_id)
        what = "overloaded" if plan.overflow.trigger == "overloaded" else "unreachable"
        if plan.budget is not None and plan.budget.exhausted is not None:
            team = plan.budget.exhausted_team
            whose = "the cloud budget" if team is None else f"team {team}'s cloud budget"
            what += f" and {whose} cannot cover the job"
        elif "fallback_disarmed" in plan.reasons:
            what += " and the cloud fallback was disarmed"
        return (
            f"**Waiting for approval to render in the cloud** — {_where(plan)} is {what}: "
            f"{_signal_text(plan)}.\n\n"
            f"- approve: `{approve}`\n- reject (run locally): `{reject}`\n"
            '- or Send a Signal `approval` with `{"approved": true, "by": "NAME", "reason": "..."}`'
            f"{_money_text(plan, markdown=True)}"
            "\n\nWithout an answer the job runs locally when the approval window ends; "
            "if a GPU host has headroom earlier, it runs locally at once."
            f"{_line_text(plan)}"
        )
    if state == "queued":
        why = f" ({_signal_text(plan)})" if plan.overflow.last_signal is not None else ""
        patience = (
            f" If none frees by {plan.patience_until:%H:%M:%S} UTC (its patience), it renders in "
            f"the cloud.{_wait_or_pay(plan)}"
            if plan.patience_until is not None
            else ""
        )
        back = ""
        if plan.preempted is not None:
            back = (
                f" **Preempted** by `{plan.preempted.by}` at {plan.preempted.at:%H:%M:%S} UTC on "
                f"`{plan.preempted.host}`: its render was taken out of ComfyUI, and it waits "
                "again at its first ask time."
            )
        return (
            f"**Waiting in the GPU line** for a place on a GPU host{why}; it runs locally as "
            f"soon as it gets one.{back}{patience}{_line_text(plan)}\n\n`spillway queue` shows "
            "the line now."
        )
    if state == "probing":
        if plan.overflow.trigger == "unreachable":
            return (
                f"**Waiting for ComfyUI to answer** — {_signal_text(plan)}; then it runs locally."
            )
        return "**Measuring the GPU hosts' load** before deciding where to render."
    if state == "running_local":
        rendering = (
            f"**Rendering locally** on GPU host `{plan.host}` (ComfyUI prompt `{plan.prompt_id}`)."
        )
        if progress is not None and progress.prompt_id == plan.prompt_id:
            rendering += f"\n\nProgress: {progress.progress.brief()}"
        since = silent_since(plan)
        if since is None:
            return rendering
        return (
            f"{rendering}\n\n**ComfyUI has not answered since {since}.** An armed job moves to "
            "the cloud after HOST_LOST_AFTER_S of silence; otherwise it waits for the host and "
            "fails after UNREACHABLE_GIVE_UP_S."
        )
    if state == "running_cloud":
        cloud = plan.cloud
        who = cloud.authorised_by if cloud else "?"
        name = label(cloud.provider) if cloud else "?"
        task = f", task `{cloud.task_id}`" if cloud and cloud.task_id else ""
        tried = ""
        if cloud and cloud.attempts:
            tried = " after " + ", ".join(f"{label(a.provider)} refused" for a in cloud.attempts)
        return f"**Rendering in the cloud** ({name}{task}){tried}, authorised by {who}."
    if state == "completed":
        where = f" (host `{plan.host}`)" if plan.host else ""
        return (
            f"**Completed** on the {plan.route} route{where}: {len(plan.outputs)} output file(s)."
        )
    if state == "cancelled":
        asked = plan.cancelled_by
        said = f": {asked.reason}" if asked is not None and asked.reason else ""
        head = f"**Cancelled** by {asked.by}{said}." if asked is not None else "**Cancelled**."
        return f"{head} {plan.error}" if plan.error else head
    return f"**Failed**: {plan.error}"


def decision_line(
    job_id: str,
    decision: Decision,
    armed: bool,
    errors: int,
    *,
    has_cloud: bool,
    patient: bool,
    why: str,
) -> str:
    """The worker's one log line per decision. `route` is where the job goes from here: a job
    waiting in line for a local place (by its patience, or with no cloud request to ask a
    person about) is `local`, whatever the decision table's row says; `why` is the verdict's,
    as `status` says it (a place taken, its position in line)."""
    if patient or decision.route == "local" or (decision.route == "await" and not has_cloud):
        taken = "local"
    else:
        taken = decision.route
    return (
        f"decision job={job_id} route={taken} trigger={decision.trigger} armed={armed} "
        f"reasons={','.join(decision.reasons) or '-'} errors={errors} why={why!r}"
    )


def _wait_or_pay(plan: Plan) -> str:
    """ "Starts in about 3 min here (estimated when it joined the line), or $0.28 on MiniMax
    now." for a job waiting by its patience: the details are written when something changes for
    the job, not as the line moves, so the estimate says when it was made (`spillway queue` and
    `status` have the current one)."""
    spot, budget = plan.queue, plan.budget
    if budget is None or budget.estimate_usd is None or budget.provider is None:
        return ""
    here = (about(spot.eta_s) if spot is not None else "").removeprefix(", ") or "later"
    made = " (estimated when it joined the line)" if here != "later" else ""
    return (
        f"\n\nStarts in {here} here{made}, or ${budget.estimate_usd:.2f} on "
        f"{label(budget.provider)} now."
    )


def _line_text(plan: Plan) -> str:
    spot = plan.queue
    hosts = f"\n\n{plan.hosts_text()}." if plan.cannot_run else ""
    if spot is None:
        return hosts
    eta = about(spot.eta_s)
    team = ""
    if plan.team is not None and spot.team_places is not None:
        team = f" Team `{plan.team}` held {places(spot.team_places)} of the GPUs then."
    return f"\n\n{ordinal(spot.position)} in line for the GPUs when it joined{eta}.{team}{hosts}"


def places(n: int) -> str:
    return f"{n} place" if n == 1 else f"{n} places"


def pool_details(
    view: PoolView, in_line: int, teams: dict[str, tuple[int, int]] | None = None
) -> str:
    """The pool's current details in the UI: each host's places, then the head of the line
    (`view.line`) of the `in_line` waiting. `teams` (places held, jobs waiting per team), where
    there is more than one: each job is named with its team."""
    several = teams is not None and len(teams) > 1

    def who(job_id: str, team: str | None) -> str:
        return f"`{job_id}` ({team})" if several and team else f"`{job_id}`"

    def holder(p: PlaceView) -> str:
        given = f", giving it to `{p.preempted_by}`" if p.preempted_by else ""
        return who(p.job_id, p.team) + given

    lines = ["**GPU places**"]
    for host in view.hosts:
        held = ", ".join(holder(p) for p in host.places) or "free"
        lines.append(
            f"- `{host.name}`: {len(host.places)} of {host.max_jobs} ({held}){host.drained_text()}"
        )
    if several and teams is not None:
        lines.append("\n**Teams**")
        for team, (held_n, waiting) in sorted(teams.items()):
            lines.append(f"- `{team}`: {places(held_n)} held, {waiting} waiting")
    if view.preemptions:
        lines.append(f"\n**Preemptions: {view.preemptions}**")
    lines.append(f"\n**In line: {in_line}**")
    for item in view.line:
        eta = about(item.eta_s) or (f": {item.why}" if item.why else "")
        team = f", team {item.team}" if several and item.team else ""
        back = f", preempted by `{item.preempted_by}`" if item.preempted_by else ""
        lines.append(
            f"{item.position}. `{item.job_id}` (priority {item.priority}{team}{back}{eta})"
        )
    if in_line > len(view.line):
        lines.append(f"... and {in_line - len(view.line)} more (`spillway queue`)")
    return "\n".join(lines)


def approval_notice(
    plan: Plan, policy: Policy, namespace: str, decide_by: datetime
) -> ApprovalNotice:
    approve, reject = commands(plan.job_id)
    link = f"{policy.ui_url}/namespaces/{namespace}/workflows/{plan.job_id}"
    trigger = plan.overflow.trigger or "overloaded"
    providers = ", then ".join(label(p) for p in policy.providers) or "no provider has keys"
    return ApprovalNotice(
        text=(
            f"spillway job {plan.job_id} waits for approval to render in the cloud "
            f"({providers}): {_where(plan)} is "
            f"{trigger} ({_signal_text(plan)}). Approve: {approve} — reject: {reject} — "
            f"or decide in the Temporal UI: {link}.{_money_text(plan, markdown=False)} Without "
            f"an answer by {decide_by:%Y-%m-%d %H:%M} UTC it runs locally."
        ),
        job_id=plan.job_id,
        trigger=plan.overflow.trigger,
        reasons=plan.reasons,
        last_signal=plan.overflow.last_signal,
        approve_command=approve,
        reject_command=reject,
        ui_link=link,
        decide_by=decide_by,
        budget=plan.budget,
    )


def ended_unused(job_id: str, state: str) -> str:
    return f"job {job_id} ended ({state}) before it could use this decision: nothing was applied"


def approved_without_key(by: str) -> str:
    return (
        f"approved by {by}, but no cloud provider key is configured on the worker: nothing was "
        f"sent. Set {key_names()} in the worker's environment and resubmit the job."
    )


def gave_up_waiting(seconds: float, plan: Plan, cloud_asked: bool = True) -> str:
    why = "nobody approved the cloud" if cloud_asked else "the job asks for no cloud"
    return (
        f"ComfyUI did not answer for {timedelta(seconds=round(seconds))} and {why}: the job was "
        f"not run ({_signal_text(plan)}). Resubmit it when ComfyUI is back "
        "(UNREACHABLE_GIVE_UP_S sets how long a job waits)."
    )


SILENT_REASON = "comfyui_unreachable_since="
ANSWERS_AGAIN = "comfyui_answers_again"


def silent_reason(since: datetime) -> str:
    return f"{SILENT_REASON}{since:%Y-%m-%dT%H:%M:%SZ}"


def silent_since(plan: Plan) -> str | None:
    """When the job's host went silent, while it still is (as the plan's reasons tell)."""
    for reason in reversed(plan.reasons):
        if reason == ANSWERS_AGAIN:
            return None
        if reason.startswith(SILENT_REASON):
            return reason.removeprefix(SILENT_REASON).replace("T", " ").replace("Z", " UTC")
    return None


def host_gave_no_answer(host: str, since: datetime, seconds: float) -> str:
    return (
        f"GPU host {host} gave no answer for {timedelta(seconds=round(seconds))} (its ComfyUI or "
        f"its agent, silent since {since:%Y-%m-%d %H:%M:%S} UTC) and the cloud fallback is not "
        "armed: the job was not finished. Resubmit it when the host's ComfyUI is back "
        "(UNREACHABLE_GIVE_UP_S sets how long a job waits for it)."
    )


def no_host_can_run(missing: dict[str, list[str]]) -> str:
    each = "; ".join(f"{host}: {', '.join(lacks)}" for host, lacks in missing.items())
    return (
        f"no GPU host can run this graph ({each}): nothing was posted or spent. Install what is "
        "missing on a host (ComfyUI's custom nodes, models), or change the graph, and submit again"
    )


def admitted_to_unknown_host(host: str, known: list[str]) -> str:
    return (
        f"the GPU pool gave this job a place on host {host!r}, which the workers' policy does "
        f"not name ({', '.join(known)}): the workers disagree on SPILLWAY_ROUTING_TIERS; nothing "
        "was rendered"
    )


def waited_past_patience(waited_s: float) -> str:
    return f"waited_{round(waited_s)}s_reached_patience"


def line_within_patience(eta_s: float, patience_s: float) -> str:
    return f"line_eta_{round(eta_s)}s_within_max_wait_{round(patience_s)}s"


def line_passed_patience(eta_s: float | None, left_s: float) -> str:
    """While it waited: the line's estimate now puts its start after its patience."""
    return f"line_eta_{round(eta_s or 0)}s_gt_patience_left_{round(left_s)}s"


def line_past_patience(eta_s: float | None, patience_s: float) -> str:
    if eta_s is None:
        return f"line_eta_unknown_max_wait_{round(patience_s)}s"
    return f"line_eta_{round(eta_s)}s_gt_max_wait_{round(patience_s)}s"


def line_unknown_within_patience(patience_s: float) -> str:
    """No render seen yet (a new pool): it waits in line, and its patience alone ends that."""
    return f"line_eta_unknown_waits_max_wait_{round(patience_s)}s"


FORGED_LATE = "ignored_forged_late"


def late_not_confirmed(lined: bool, position: int | None, eta_s: float | None) -> str:
    """A `late` the job could not confirm with the pool: it waits on."""
    if not lined:
        return f"{FORGED_LATE}: the GPU pool does not have this job's ask in its line"
    eta = f"about {duration(eta_s)}" if eta_s is not None else "no estimate yet"
    where = f"{ordinal(position or 0)} in line, {eta}"
    return f"{FORGED_LATE}: the GPU pool's own estimate keeps it within its patience ({where})"


def late_not_its_ask(asked_at: datetime, patient: bool) -> str:
    """A `late` answer to an ask the job did not send, or one that waits by no patience."""
    asked = f"asked at {asked_at:%H:%M:%S}"
    if not patient:
        return f"{FORGED_LATE}: this job waits in line by no patience ({asked})"
    return f"{FORGED_LATE}: an answer to an ask this job did not send ({asked})"


def stalled_since(since: datetime, node: str | None) -> str:
    where = f" at node {node}" if node else ""
    return f"its render made no progress{where} since {since:%H:%M:%S} UTC"


def stalled_twice(host: str, since: datetime, node: str | None) -> str:
    return (
        f"the render on GPU host {host} stalled twice ({stalled_since(since, node)}; the first "
        "time it was interrupted and tried again): the job was not finished. Check that host's "
        "ComfyUI (a custom node that hangs?), or raise RENDER_STALL_S for renders that are "
        "silent that long, then resubmit."
    )


def lost_too_often(attempts: int) -> str:
    return (
        f"ComfyUI lost the prompt {attempts} times (restarts during the render?): "
        "gave up after COMFYUI_MAX_ATTEMPTS submits. Check ComfyUI's log, then resubmit."
    )


def ambiguous_create(plan: Plan, at: datetime) -> str:
    provider = plan.cloud.provider if plan.cloud else "?"
    return (
        f"the {label(provider)} create call for job {plan.job_id} did not "
        f"complete (the worker was lost during the call, started {at:%Y-%m-%d %H:%M:%S} UTC): a "
        f"charge may exist. {check(provider)}."
    )


def lost_create_unanswered(provider: str, ambiguous: str, why: BaseException | None) -> str:
    name = label(provider)
    return f"{ambiguous} Asking {name} by the create's external_task_id failed too: {why}."


def lost_create_made_nothing(provider: str, ambiguous: str, found: Reconciled) -> str:
    return (
        f"{ambiguous} Once none of its requests could still arrive, {label(provider)} had no "
        "task with "
        f"external_task_id {found.external_task_id}: most likely nothing was made, but the spend "
        "ledger keeps the charge as possible (maybe_charged)."
    )


def _usd(value: float | None) -> str:
    return "unknown" if value is None else f"${value:.2f}"


def _money_text(plan: Plan, *, markdown: bool) -> str:
    """The estimate and what the budgets have left ("" when nothing is known)."""
    view = plan.budget
    if view is None:
        return ""
    parts = [f"cloud estimate {_usd(view.estimate_usd)}"]
    for whose, period, left in (
        ("", "today", view.day_remaining_usd),
        ("", "this month", view.month_remaining_usd),
        (f"team {view.team}: ", "today", view.team_day_remaining_usd),
        (f"team {view.team}: ", "this month", view.team_month_remaining_usd),
    ):
        if left is not None:
            parts.append(f"{whose}{_usd(left)} left {period}")
    text = "; ".join(parts)
    if view.exhausted is not None:
        whose = "" if view.exhausted_team is None else f"team {view.exhausted_team}'s "
        text += (
            f". {BUDGET_EXHAUSTED}: {whose or 'the '}"
            f"{'daily' if view.exhausted == 'day' else 'monthly'} budget cannot cover it: "
            f"only `spillway approve {plan.job_id} --by NAME --over-budget` sends it to the cloud"
        )
    return f"\n\n{text}." if markdown else f" {text}."


def exhausted_view(view: BudgetView | None, shortfall: BudgetShortfall) -> BudgetView:
    known = view or BudgetView()
    left = {
        "day_remaining_usd" if shortfall.period == "day" else "month_remaining_usd": (
            shortfall.remaining_usd
        )
    }
    if shortfall.team is not None:
        left = {f"team_{key}": value for key, value in left.items()}
    return known.model_copy(
        update={
            "estimate_usd": shortfall.estimate_usd,
            "exhausted": shortfall.period,
            "exhausted_team": shortfall.team,
            **left,
        }
    )


def not_an_approver(job_id: str, by: str, team: str, approvers: list[str]) -> str:
    listed = ", ".join(approvers) if approvers else "nobody"
    return (
        f"refused: {by} is not an approver of team {team} (its approvers: {listed}); job "
        f"{job_id} keeps waiting for one of them"
    )


def exhausted_by(view: BudgetView | None) -> str:
    """The reason beside `budget_exhausted` that names the budget: `budget_exhausted_by=studio`
    or `budget_exhausted_by=team:NAME`."""
    team = view.exhausted_team if view is not None else None
    return f"{BUDGET_EXHAUSTED}_by={'studio' if team is None else f'team:{team}'}"


def over_budget(shortfall: BudgetShortfall, job_id: str) -> str:
    return (
        f"not used: {shortfall.text()}. Only `spillway approve {job_id} --by NAME --over-budget` "
        "goes past the budget"
    )


def not_signed(job_id: str, why: str) -> str:
    """A decision the workers refused: `why` is spillway.core.approvals' ("unsigned", ...)."""
    fix = {
        "unsigned": "send it with `spillway approve|reject` or spillway.client on a machine "
        "that has SPILLWAY_APPROVAL_SECRET (a signal typed into the Temporal UI cannot spend)",
        "bad signature": "it was not signed with the workers' SPILLWAY_APPROVAL_SECRET for this "
        "job, or was changed after signing: decide again with the workers' secret",
        "old signature": "it was signed by an earlier spillway, for the job id only: decide "
        "again with `spillway approve|reject` of this release",
    }.get(why, "decide again: a signature is good for 15 minutes")
    return f"not used: job {job_id} takes only signed decisions (this one: {why}): {fix}"


def not_checked(job_id: str, why: str) -> str:
    return (
        f"not used: the workers could not check the signature of this decision for job "
        f"{job_id} ({why}): decide again"
    )


def headroom_won() -> str:
    return (
        "not used: a GPU host had headroom again before the approval was used; the job runs locally"
    )


def cancelled_after_create(provider: str, task_id: str) -> str:
    name = label(provider)
    return (
        f"cancelled while the {name} create was in flight: it had already ordered task {task_id}, "
        f"which {name} will charge. spillway recorded it in the spend ledger and did not download "
        f"it; the video can be fetched from the {name} console while it is kept there."
    )


def every_provider_refused(attempts: list[CloudAttempt]) -> str:
    said = "; ".join(f"{label(a.provider)}: {a.why}" for a in attempts)
    return f"every cloud provider refused the job before making anything (nothing charged): {said}"


def create_exists(plan: Plan, entry: SpendEntry) -> str:
    return (
        f"job {plan.job_id} already has a cloud create in the spend ledger ({describe(entry)}): "
        f"spillway never creates twice for a job (a reset or re-run included). "
        f"{check(entry.provider)}."
    )


def create_never_began(plan: Plan, times: int) -> str:
    return (
        f"the worker running the cloud create for job {plan.job_id} was lost before the create "
        f"began, {times} times in a row: nothing was sent and nothing charged (the spend ledger "
        "released each reservation). Check that the workers are running and not starved, then "
        "resubmit the job."
    )
