"""Text for people: the load status, the health report, a job's plan, a list of jobs, the budget.
`--json` prints the models themselves; these are the human forms of the same data."""

from __future__ import annotations

import textwrap

from spillway.cli.health import Health
from spillway.cli.pool_health import NEXT_POOL, PoolHealth
from spillway.client.jobs import JobSummary
from spillway.core.decision import about
from spillway.core.gpu_pool import PoolView
from spillway.core.ledger import LedgerSummary, MonthSpend
from spillway.core.models import HostCapabilities, LoadStatus, Plan, Quote
from spillway.core.teams import STUDIO


def _pct(value: float | None) -> str:
    return "not measured" if value is None else f"{value:g}%"


def render_load(load: LoadStatus) -> str:
    verdict = "OVERLOADED" if load.overloaded else "not overloaded"
    reach = "reachable" if load.reachable else "UNREACHABLE"
    if load.queue_pending is None or load.queue_running is None:
        queue = "not measured"
    else:
        queue = f"{load.queue_running} running, {load.queue_pending} pending"
    if load.guard_busy is None:
        guard = "not measured"
    else:
        guard = f"busy (job {load.guard_job or 'unknown'})" if load.guard_busy else "free"
    lines = [
        f"GPU {verdict}; ComfyUI {reach}  (measured from this shell, COMFYUI_URL and A40_*, "
        f"{load.measured_at:%Y-%m-%d %H:%M:%S} UTC)",
        f"  VRAM used  {_pct(load.vram_pct)}  (busy at >= {load.thresholds.vram_busy_pct:g}%)",
        f"  GPU util   {_pct(load.gpu_util_pct)}  "
        f"(busy at >= {load.thresholds.util_busy_pct:g}% with a pending queue)",
        f"  queue      {queue}",
        f"  guard      {guard}",
        "  reasons    " + (", ".join(load.reasons) or "none"),
    ]
    lines += ["  error      " + e for e in load.errors]
    lines.append("(this shell's reading; `spillway health` shows what each GPU host's agent sees)")
    return "\n".join(lines)


def render_health(health: Health) -> str:
    cloud, approval, temporal = health.cloud_fallback, health.approval, health.temporal
    yes = {True: "yes", False: "no"}
    if temporal.reachable:
        workers = sorted({p.identity for p in temporal.pollers})
        lines = [
            f"Temporal: {temporal.address} namespace {temporal.namespace!r}; task queue "
            f"{temporal.task_queue!r} polled by {len(workers)} worker(s)"
            + (f" ({', '.join(workers)})" if workers else ": start one (spillway worker)"),
            f"Jobs awaiting approval: {temporal.awaiting_approval}",
            *_pool_lines(temporal.gpu_pool),
        ]
    else:
        lines = [f"Temporal: NOT reachable: {temporal.error}"]
    lines += _workers_lines(health)
    # Everything from here is read from this shell's environment, which may differ from the
    # workers' (a key only they hold): unlabelled, it reads as the workers' section going on.
    lines.append("This shell sees (its own environment; jobs follow what the workers see):")
    lines.append(f"Trigger: {health.trigger}")
    for s in health.sources:
        lines.append(f"  {s.name:<20} {s.rule:<45} {s.endpoint or 'not configured: skipped'}")
    lines += [
        f"  each source answers within {health.probe_timeout_s:g}s or counts as failed; "
        f"'unreachable' needs a second probe {health.unreachable_confirm_s:g}s later",
        f"Cloud fallback: armed {yes[cloud.armed]} (CLOUD_VIDEO_FALLBACK_ENABLED "
        f"{yes[cloud.fallback_enabled]}); providers tried in turn: "
        + (" then ".join(cloud.order) or "none (no key)"),
        *(
            f"  {p.name:<8} (tier {p.tier}) at {p.base_url}: key present {yes[p.key_present]}"
            for p in cloud.providers
        ),
        f"Approval: waits {approval.timeout_s:g}s (then the job runs locally); meanwhile the GPU "
        f"pool re-probes each host with a free place every {approval.pool_reprobe_s:g}s, webhook "
        f"{'set' if approval.webhook_configured else 'not set'}",
        f"  who can approve: {approval.who_can_approve}",
        _budget_line(health),
        "Decision:",
        *(f"  {row}" for row in health.decision),
        "Load now, measured from this shell:",
        render_load(health.load),
    ]
    return "\n".join(lines)


def _pool_lines(pool: PoolHealth | None) -> list[str]:
    if pool is None:
        return []
    if pool.state == "not_started":
        return [
            "GPU pool: not started (no job has asked for a GPU place yet; the first ask starts it)"
        ]
    if pool.wedged is not None:
        line = "GPU pool: WEDGED"
    elif pool.state != "running":
        line = f"GPU pool: {pool.state.upper()}" + (f" ({pool.status})" if pool.status else "")
    else:
        line = (
            f"GPU pool: running ({pool.workflow_id}, run {pool.run_id}, {pool.history_length} "
            "events in this run)"
        )
        if pool.places_in_use is not None:
            line += f"; {pool.places_in_use} place(s) in use, {pool.line_length} job(s) in line"
        for name, d in pool.drained.items():
            why = f": {d.reason}" if d.reason else ""
            line += f"; host {name} DRAINED by {d.by} since {d.since:%Y-%m-%d %H:%M} UTC{why}"
    # The error names the pool, its run and what to do.
    return [line] + ([f"  {pool.error}"] if pool.error else [])


def _workers_lines(health: Health) -> list[str]:
    workers = health.workers
    if workers is None:
        return []
    if workers.view is None:
        return [f"Workers: {workers.error}"]
    view, yes = workers.view, {True: "yes", False: "no"}
    p = view.policy
    lines = [
        f"Workers see: cloud fallback armed {yes[p.fallback_enabled and p.key_present]} "
        f"(switch {yes[p.fallback_enabled]}, key present {yes[p.key_present]}); VRAM busy at "
        f">= {p.thresholds.vram_busy_pct:g}%, util at >= {p.thresholds.util_busy_pct:g}%; "
        f"approval window {p.approval_timeout_s:g}s",
    ]
    for host in view.hosts:
        if host.load is None:
            lines.append(f"  host {host.name:<14} NO AGENT: {host.error}")
            continue
        load = host.load
        verdict = "OVERLOADED" if load.overloaded else "headroom"
        if not load.reachable:
            verdict = "ComfyUI unreachable"
        lines.append(
            f"  host {host.name:<14} {verdict}; VRAM {_pct(load.vram_pct)}, queue "
            f"{load.queue_running} running / {load.queue_pending} pending; agent {load.agent}"
        )
        can_run = (
            capabilities_brief(host.capabilities)
            if host.capabilities
            else f"not read ({host.capabilities_error})"
        )
        lines.append(f"  {'':<19} can run: {can_run}")
    return lines


def capabilities_brief(can: HostCapabilities) -> str:
    """`479 node classes; checkpoints 2, loras 5 (read 11:02:31)`."""
    models = ", ".join(f"{folder} {n}" for folder, n in sorted(can.models.items()))
    return f"{can.nodes} node classes; {models or 'no model files'} (read {can.read_at:%H:%M:%S})"


def _budget_line(health: Health) -> str:
    budget = health.budget

    def cap(value: float | None) -> str:
        return "no cap" if value is None else f"${value:.2f}"

    if budget is None:
        return "Budget: unknown (Temporal not reachable)"
    line = f"Budget: {cap(budget.daily_usd)} a day, {cap(budget.monthly_usd)} a month (UTC)"
    if not budget.read:
        line = "Budget: unknown (the ledger was not read)"
    if budget.day is not None and budget.month is not None:
        line += (
            f"; spent {cap(budget.day.spent_usd)} today, {cap(budget.month.spent_usd)} this "
            f"month; left {cap(budget.day.remaining_usd)} / {cap(budget.month.remaining_usd)}"
        )
    elif budget.error:
        line += f"; ledger: {budget.error}"
    if budget.warning:
        line += f"; WARNING: {budget.warning}"
    if budget.unsealed:
        line += f"; WARNING: {budget.unsealed}"
    if budget.worker_settings:
        line += f"; NOTE: {budget.worker_settings}"
    return line


def render_plan(plan: Plan) -> str:
    route = f" on the {plan.route} route" if plan.route else ""
    lines = [f"job {plan.job_id}: {plan.state}{route}"]
    if _teamed(plan.team):
        lines.append(f"  team      {plan.team}")
    if plan.reasons:
        lines.append("  reasons   " + ", ".join(plan.reasons))
    signal = plan.overflow.last_signal
    if plan.overflow.trigger and signal is not None:
        why = ", ".join(signal.reasons) or "no reason"
        lines.append(
            f"  overflow  {plan.overflow.trigger}: {why} "
            f"(measured {signal.measured_at:%Y-%m-%d %H:%M:%S} UTC)"
        )
    if plan.approval is not None:
        verdict = "approved" if plan.approval.approved else "rejected"
        said = f": {plan.approval.reason}" if plan.approval.reason else ""
        lines.append(
            f"  approval  {verdict} by {plan.approval.by} "
            f"at {plan.approval.at:%Y-%m-%d %H:%M:%S} UTC"
            + (", signed" if plan.approval.signed else "")
            + said
        )
    for change in plan.priority_changes:
        said = f": {change.reason}" if change.reason else ""
        lines.append(
            f"  priority  {change.priority} (was {change.was}) by {change.by} "
            f"at {change.at:%Y-%m-%d %H:%M:%S} UTC{said}"
        )
    if plan.cancelled_by is not None:
        said = f": {plan.cancelled_by.reason}" if plan.cancelled_by.reason else ""
        lines.append(
            f"  cancel    asked by {plan.cancelled_by.by} "
            f"at {plan.cancelled_by.at:%Y-%m-%d %H:%M:%S} UTC{said}"
        )
    if plan.preempted is not None:
        lines.append(
            f"  preempted by {plan.preempted.by} on {plan.preempted.host} "
            f"at {plan.preempted.at:%Y-%m-%d %H:%M:%S} UTC: its render was taken out of ComfyUI "
            "and it waited in line again at its first ask time"
        )
    if plan.quote is not None:
        lines.append(f"  decided   {plan.quote.route}: {plan.quote.why}")
    if plan.state == "awaiting_approval":
        lines.append(f"  decide    spillway approve|reject {plan.job_id} --by NAME [--reason TEXT]")
    if plan.cannot_run:
        lines.append("  hosts     " + plan.hosts_text())
    if plan.patience_until is not None and plan.state in ("queued", "awaiting_approval"):
        lines.append(
            f"  patience  to the cloud at {plan.patience_until:%Y-%m-%d %H:%M:%S} UTC unless a "
            "GPU place frees first"
        )
    if plan.queue is not None:
        q = plan.queue
        eta = about(q.eta_s) or (f"; waits for: {q.waits_for}" if q.waits_for else "")
        lines.append(
            f"  line      {q.position} in line for the GPUs ({q.ahead} ahead{eta}); "
            "`spillway queue` shows it"
        )
    if plan.budget is not None:
        lines.append("  money     " + _money(plan))
    if plan.progress is not None:
        lines.append(f"  progress  {plan.progress.brief()}")
    if plan.prompt_id is not None:
        host = f" on host {plan.host}" if plan.host else ""
        lines.append(f"  comfyui   prompt {plan.prompt_id}{host} (submit {plan.local_attempts})")
    if plan.cloud is not None:
        c = plan.cloud
        cost = (
            f", estimated ${c.estimated_cost_usd:.2f}" if c.estimated_cost_usd is not None else ""
        )
        how = " over the budget" if c.authorisation == "approved_over_budget" else ""
        lines.append(
            f"  cloud     {c.provider} task {c.task_id or '(not created)'}{cost}, "
            f"authorised by {c.authorised_by}{how}"
        )
    for out in plan.outputs:
        lines.append(f"  output    {out.path}  {out.bytes} bytes  sha256 {out.sha256}")
        if out.uri:
            lines.append(f"            {out.uri}" + (f"  {out.url}" if out.url else ""))
    for ignored in plan.ignored_signals:
        verdict = {True: "approval", False: "rejection", None: "signal"}[ignored.approved]
        who = f" by {ignored.by}" if ignored.by else ""
        lines.append(f"  ignored   {verdict}{who}: {ignored.why}")
    if plan.error:
        lines.append(f"  error     {plan.error}")
    return "\n".join(lines)


def _money(plan: Plan) -> str:
    view = plan.budget
    assert view is not None

    def usd(value: float | None) -> str:
        return "unknown" if value is None else f"${value:.2f}"

    text = f"cloud estimate {usd(view.estimate_usd)}"
    if view.day_remaining_usd is not None:
        text += f", {usd(view.day_remaining_usd)} left today"
    if view.month_remaining_usd is not None:
        text += f", {usd(view.month_remaining_usd)} left this month"
    if view.team_day_remaining_usd is not None:
        text += f", team {view.team}: {usd(view.team_day_remaining_usd)} left today"
    if view.team_month_remaining_usd is not None:
        text += f", team {view.team}: {usd(view.team_month_remaining_usd)} left this month"
    if view.exhausted is not None:
        which = f"the {view.exhausted}'s budget"
        if view.exhausted_team is not None:
            period = "daily" if view.exhausted == "day" else "monthly"
            which = f"team {view.exhausted_team}'s {period} budget"
        text += f"; {which} cannot cover it: approve with --over-budget"
    return text


def render_jobs(jobs: list[JobSummary]) -> str:
    if not jobs:
        return "no jobs"
    width = max(len(j.job_id) for j in jobs)
    lines = [f"{'JOB':<{width}}  {'STATE':<17}  {'ROUTE':<5}  {'HOST':<12}  PRIO  STARTED (UTC)"]
    for j in jobs:
        prio = "-" if j.priority is None else str(j.priority)
        lines.append(
            f"{j.job_id:<{width}}  {j.state:<17}  {j.route or '-':<5}  {j.host or '-':<12}  "
            f"{prio:<4}  {j.started:%Y-%m-%d %H:%M:%S}"
        )
    return "\n".join(lines)


def _teamed(team: str | None) -> bool:
    """Whether a team is worth a word: a studio without a teams file has one team, studio."""
    return team is not None and team != STUDIO


def render_queue(view: PoolView, *, wide: bool = False) -> str:
    """Each host's places, then the line as a table that fits 100 columns: job ids cut short
    (`--json` has them whole) and each why whole, wrapped under its column. `wide`: nothing
    cut or wrapped, a row per job however long."""
    if view.pool == "closed":
        return (
            f"the GPU pool is closed ({view.closed}): {NEXT_POOL} (at the latest when a job in "
            "line asks again, within SPILLWAY_POOL_LINE_CHECK_S)"
        )
    if not view.hosts:
        return "the GPU pool has not started: no job has asked for a GPU place yet"
    ids = [p.job_id for h in view.hosts for p in h.places] + [i.job_id for i in view.line]
    held_w, line_w = (max(40, *map(len, ids)), max(32, *map(len, ids))) if wide else (40, 32)
    lines = ["GPU places"]
    for host in view.hosts:
        state = "" if host.reachable is not False else "  (not answering)"
        lines.append(
            f"  {host.name}: {len(host.places)} of {host.max_jobs} in use{state}"
            f"{host.drained_text()}"
        )
        if host.capabilities is not None:
            lines.append(f"    can run: {capabilities_brief(host.capabilities)}")
        lines += [
            f"    {_fit(p.job_id, held_w, wide):<{held_w}}  {p.state or '':<17}  "
            f"since {p.since:%H:%M:%S}"
            + (f"  team {p.team}" if _teamed(p.team) else "")
            + (f"  (left: taking prompt {p.clearing} out of ComfyUI)" if p.clearing else "")
            + (f"  (preempted: giving its place to {p.preempted_by})" if p.preempted_by else "")
            for p in host.places
        ]
    if view.preemptions:
        lines.append(f"preemptions since the pool started: {view.preemptions}")
    if not view.line:
        lines.append("nobody waits in line")
        return "\n".join(lines)
    lines.append(f"in line: {len(view.line)}")
    lines.append(f"  {'#':>4}  {'job':<{line_w}}  {'prio':>4}  {'since':<8}  {'ETA':>7}  why")
    for item in view.line:
        # No estimate, or one of now for a job still in line: its why says what it waits for.
        eta = f"~{_eta(item.eta_s)}" if item.eta_s is not None and about(item.eta_s) else "-"
        why = f"team {item.team}; {item.why}" if _teamed(item.team) else item.why
        if item.preempted_by is not None:
            why = f"preempted by {item.preempted_by}; {why}"
        if item.patience_until is not None:
            why += f"; cloud at {item.patience_until:%H:%M:%S}"
        row = (
            f"  {item.position:>4}  {_fit(item.job_id, line_w, wide):<{line_w}}  "
            f"{item.priority:>4}  {item.since:%H:%M:%S}  {eta:>7}  "
        )
        if wide:
            lines.append(row + why)
            continue
        # "cloud at HH:MM:SS" and a drain's reason come last: a cut why loses them first.
        parts = textwrap.wrap(why, 100 - len(row), break_on_hyphens=False) or [""]
        lines.append(row + parts[0])
        lines += [" " * len(row) + part for part in parts[1:]]
    return "\n".join(lines)


def render_quote(quote: Quote) -> str:
    """`spillway quote`: the route now, why, and both prices of waiting."""
    local = quote.local
    eta = "now" if local.position == 0 else f"{local.position} in line"
    if local.position and local.eta_s is not None and about(local.eta_s):
        eta += f", starts in about {_eta(local.eta_s)}"
    lines = [
        f"route: {quote.route}",
        f"  why     {quote.why}",
        f"  here    {eta} on {', '.join(local.hosts) or 'no host'}",
    ]
    cloud = quote.cloud
    if cloud is None:
        lines.append("  cloud   none (no cloud prompt, or no cloud key on the workers)")
    else:
        cost = "no estimate" if cloud.estimate_usd is None else f"${cloud.estimate_usd:.2f}"
        left = (
            "no budget set"
            if cloud.budget_left_usd is None
            else f"${cloud.budget_left_usd:.2f} left in the budget"
        )
        lines.append(f"  cloud   {cost} on {cloud.provider} ({left})")
    return "\n".join(lines)


def render_hosts(view: PoolView) -> str:
    """`spillway host list`: every GPU host's places, whether it answers, and its drain."""
    if not view.hosts:
        return render_queue(view)
    lines = []
    for host in view.hosts:
        answers = {None: "not seen yet", True: "answers", False: "NOT ANSWERING"}[host.reachable]
        lines.append(
            f"  {host.name:<16} {len(host.places)} of {host.max_jobs} places held; {answers}"
            f"{host.drained_text()}"
        )
        if host.capabilities is not None:
            lines.append(f"  {'':<16} can run: {capabilities_brief(host.capabilities)}")
    return "\n".join(["GPU hosts", *lines])


def _fit(text: str, width: int, wide: bool) -> str:
    return text if wide else _cut(text, width)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _eta(seconds: float) -> str:
    return f"{round(seconds)} s" if seconds < 90 else f"{round(seconds / 60)} min"


def budget_set_line(summary: LedgerSummary) -> str:
    """Who set the ledger's budget: it is the ledger's, set by `spillway budget --day/--month`."""
    held = summary.budget_set
    if held is None:
        capped = summary.day.budget_usd is not None or summary.month.budget_usd is not None
        if capped:
            return (
                "budget set before the ledger recorded who sets it (spillway budget --day/--month)"
            )
        return "no budget set (spillway budget --day/--month sets one)"
    how = "announced by" if held.seed else "set by"
    return f"budget {how} {held.by}, taken {held.at:%Y-%m-%d %H:%M:%S} UTC"


def render_budget(summary: LedgerSummary) -> str:
    def usd(value: float | None) -> str:
        return "no cap" if value is None else f"${value:.2f}"

    lines = []
    if summary.closed_as is not None:
        lines.append(
            f"the spend ledger is closed ({summary.closed_as}): no cloud create is sent until "
            "`spillway ledger restore`; what it held when it closed:"
        )
    lines.append(
        f"{'cloud spend (UTC)':<18}{'budget':>10}{'spent':>10}{'reserved':>10}{'left':>10}"
    )
    for label, totals in (("today", summary.day), ("this month", summary.month)):
        lines.append(
            f"  {label:<16}{usd(totals.budget_usd):>10}{usd(totals.spent_usd):>10}"
            f"{usd(totals.reserved_usd):>10}{usd(totals.remaining_usd):>10}"
        )
    lines.append(budget_set_line(summary))
    if not summary.entries:
        lines.append("no cloud creates held this month")
        return "\n".join(lines)
    lines.append(
        "this month's creates the ledger holds (maybe_charged counts as spent; --month lists all):"
    )
    for e in summary.entries:
        task = e.task_id or "-"
        lines.append(
            f"  {e.at:%Y-%m-%d %H:%M}  {e.job_id}  {e.provider}  task {task}  "
            f"{usd(e.cost_usd)}  {e.state}  {e.authorisation} by {e.authorised_by}"
        )
    return "\n".join(lines)


def render_month(month: MonthSpend) -> str:
    lines = [f"cloud spend in {month.month} (UTC): ${month.spent_usd:.2f}"]
    if not month.entries:
        lines.append(f"no creates recorded in the {month.runs_read} ledger runs still kept")
    for e in month.entries:
        cost = "-" if e.cost_usd is None else f"${e.cost_usd:.2f}"
        lines.append(
            f"  {e.at:%Y-%m-%d %H:%M}  {e.job_id}  {e.provider}  task {e.task_id or '-'}  "
            f"{cost}  {e.state}  {e.authorisation} by {e.authorised_by}"
        )
    return "\n".join(lines)
