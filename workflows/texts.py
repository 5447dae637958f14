"""What VideoJobWorkflow tells people: current details for the Temporal UI, the approval notice,
failure messages. Pure string building (deterministic), kept apart so the workflow reads as flow."""

from __future__ import annotations

from datetime import datetime, timedelta

from spillway.models import ApprovalNotice, Plan, Policy

MINIMAX_CHECK = (
    "check MiniMax's console (platform.minimax.io: usage / billing, video generation tasks) for a "
    "task created at that time before resubmitting; spillway will not create again for this job"
)


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


def current_details(plan: Plan) -> str:
    """Markdown for the Temporal UI's "Current details": what the job waits for and why."""
    state = plan.state
    if state == "awaiting_approval":
        approve, reject = commands(plan.job_id)
        what = "overloaded" if plan.overflow.trigger == "overloaded" else "unreachable"
        return (
            f"**Waiting for approval to render in the cloud** — the A40 is {what}: "
            f"{_signal_text(plan)}.\n\n"
            f"- approve: `{approve}`\n- reject (run locally): `{reject}`\n"
            '- or Send a Signal `approval` with `{"approved": true, "by": "NAME", "reason": "..."}`'
            "\n\nWithout an answer the job runs locally when the approval window ends; "
            "if the A40 has headroom earlier, it runs locally at once."
        )
    if state == "probing":
        if plan.overflow.trigger == "unreachable":
            return (
                f"**Waiting for ComfyUI to answer** — {_signal_text(plan)}; then it runs locally."
            )
        return "**Measuring the A40's load** before deciding where to render."
    if state == "running_local":
        return f"**Rendering locally** on the A40 (ComfyUI prompt `{plan.prompt_id}`)."
    if state == "running_cloud":
        cloud = plan.cloud
        who = cloud.authorised_by if cloud else "?"
        task = f", task `{cloud.task_id}`" if cloud and cloud.task_id else ""
        return f"**Rendering in the cloud** (MiniMax{task}), authorised by {who}."
    if state == "completed":
        return f"**Completed** on the {plan.route} route: {len(plan.outputs)} output file(s)."
    if state == "cancelled":
        return "**Cancelled**."
    return f"**Failed**: {plan.error}"


def approval_notice(
    plan: Plan, policy: Policy, namespace: str, decide_by: datetime
) -> ApprovalNotice:
    approve, reject = commands(plan.job_id)
    link = f"{policy.ui_url}/namespaces/{namespace}/workflows/{plan.job_id}"
    trigger = plan.overflow.trigger or "overloaded"
    return ApprovalNotice(
        text=(
            f"spillway job {plan.job_id} waits for approval to render in the cloud: the A40 is "
            f"{trigger} ({_signal_text(plan)}). Approve: {approve} — reject: {reject} — "
            f"or decide in the Temporal UI: {link}. Without an answer by "
            f"{decide_by:%Y-%m-%d %H:%M} UTC it runs locally."
        ),
        job_id=plan.job_id,
        trigger=plan.overflow.trigger,
        reasons=plan.reasons,
        last_signal=plan.overflow.last_signal,
        approve_command=approve,
        reject_command=reject,
        ui_link=link,
        decide_by=decide_by,
    )


def approved_without_key(by: str) -> str:
    return (
        f"approved by {by}, but MINIMAX_API_KEY is not configured on the worker: nothing was sent "
        "to MiniMax. Set MINIMAX_API_KEY in the worker's environment and resubmit the job."
    )


def gave_up_waiting(seconds: float, plan: Plan) -> str:
    return (
        f"ComfyUI did not answer for {timedelta(seconds=round(seconds))} and nobody approved the "
        f"cloud: the job was not run ({_signal_text(plan)}). Resubmit it when ComfyUI is back "
        "(UNREACHABLE_GIVE_UP_S sets how long a job waits)."
    )


def lost_too_often(attempts: int) -> str:
    return (
        f"ComfyUI lost the prompt {attempts} times (restarts during the render?): "
        "gave up after COMFYUI_MAX_ATTEMPTS submits. Check ComfyUI's log, then resubmit."
    )


def ambiguous_create(plan: Plan, at: datetime) -> str:
    return (
        f"the MiniMax create call for job {plan.job_id} did not complete (the worker was lost "
        f"during the call, started {at:%Y-%m-%d %H:%M:%S} UTC): a charge may exist. "
        f"{MINIMAX_CHECK}."
    )
