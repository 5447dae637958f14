"""What people read matches what the job does (issue 61, item 2): the worker's log line per
decision names the route the job takes, and a job that has left the GPU line shows no place in
it and no patience. Pure texts and renderers, no server."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from spillway.cli.render import render_plan, render_queue
from spillway.client.jobs import out_of_line
from spillway.core.decision import Line, Seen, route
from spillway.core.gpu_pool import HostSeen, PoolAsk, PoolHost, PoolInput
from spillway.core.hosts import ref
from spillway.core.models import LoadStatus, Plan, QueueSpot, Thresholds, plan_json
from spillway.core.pool_book import PoolBook
from workflows import texts

NOW = datetime(2026, 12, 6, 18, 0, tzinfo=UTC)
FULL = ["gpu_places_full_a40_2of2"]


def reading(overloaded: bool = False) -> LoadStatus:
    return LoadStatus(
        reachable=True,
        overloaded=overloaded,
        reasons=["vram_used_97.0pct_ge_85.0pct"] if overloaded else [],
        measured_at=NOW,
        thresholds=Thresholds(vram_busy_pct=85, util_busy_pct=95),
    )


def logged(seen: Seen, *, patient: bool = False) -> str:
    verdict = route(seen)
    return texts.decision_line(
        "job-1",
        verdict.decision,
        seen.armed,
        0,
        has_cloud=seen.has_cloud,
        patient=patient,
        why=verdict.why,
    )


@pytest.mark.parametrize(
    ("name", "seen", "patient", "says"),
    [
        (
            "no cloud request, places full: it waits in line for a local place",
            Seen(load=reading(), armed=False, has_cloud=False, line=Line(position=2, full=FULL)),
            False,
            "route=local",
        ),
        (
            "armed and patient, places full: it waits in line and renders here",
            Seen(
                load=reading(),
                armed=True,
                has_cloud=True,
                patience_s=600.0,
                line=Line(position=1, eta_s=30.0, full=FULL),
            ),
            True,
            "route=local",
        ),
        (
            "a cloud request, not armed: a person decides",
            Seen(load=reading(True), armed=False, has_cloud=True, line=Line(position=1, full=FULL)),
            False,
            "route=await",
        ),
        (
            "armed, no patience: the cloud",
            Seen(load=reading(True), armed=True, has_cloud=True),
            False,
            "route=cloud",
        ),
        (
            "busy by the probe, but a place now: it says the place",
            Seen(load=reading(True), armed=False, has_cloud=False, line=Line(host="a40")),
            False,
            "why='a place on a40 now'",
        ),
    ],
)
def test_the_decision_log_line_names_the_route_the_job_takes(
    name: str, seen: Seen, patient: bool, says: str
):
    line = logged(seen, patient=patient)
    assert f" {says}" in line, line
    if not seen.has_cloud:
        assert "person" not in line, line


def test_a_waiting_job_without_a_cloud_request_is_never_told_a_person_decides():
    seen = Seen(load=reading(True), armed=False, has_cloud=False, line=Line(position=1, full=FULL))
    verdict = route(seen)
    plan = Plan(job_id="job-1", state="queued")
    plan.overflow.trigger, plan.overflow.last_signal = verdict.decision.trigger, seen.load
    plan.queue = QueueSpot(position=1, ahead=0, eta_s=None)
    for text in (verdict.why, verdict.decision.why, texts.current_details(plan)):
        assert "person" not in text and "approv" not in text, text


@pytest.mark.parametrize("state", ["completed", "cancelled", "failed", "running_local"])
def test_a_job_that_left_the_line_shows_no_place_in_it_and_no_patience(state: str):
    """The plan a job published last while it waited (a cancel or a place ends the wait before
    the next publication) still carries both: `status` and its `--json` show neither."""
    plan = Plan(
        job_id="job-1",
        state=state,
        queue=QueueSpot(position=1, ahead=0, eta_s=12.0),
        patience_until=NOW,
    )
    assert "patience" not in render_plan(plan)
    shown = json.loads(plan_json(out_of_line(plan)))
    assert "in line" not in render_plan(plan)
    assert shown["queue"] is None and shown["patience_until"] is None


def test_an_estimate_behind_an_overloaded_host_says_what_the_job_waits_for_not_0_s():
    """A free place on a host whose probe says busy: the job that waits for headroom (or a
    person) would start "now" by the places alone, and sits in line all the same."""
    book = PoolBook(PoolInput())
    book.configure([PoolHost(ref=ref("q", "a40", 2), max_jobs=2)])
    book.holds_s = {"a40": [60.0]}
    busy = [HostSeen(name="a40", reachable=True, headroom=False)]
    book.ask(PoolAsk(job_id="job-1", asked_at=NOW, mode="headroom", seen=busy), NOW)
    spot, view = book.spot("job-1", NOW), book.view(NOW)
    assert spot is not None and spot.eta_s == 0.0  # the figure for scripts stays as it was
    shown = [
        render_plan(Plan(job_id="job-1", state="awaiting_approval", queue=spot)),
        render_queue(view),
        texts.pool_details(view, 1),
        texts.current_details(Plan(job_id="job-1", state="awaiting_approval", queue=spot)),
    ]
    for text in shown:
        assert "0 s" not in text, text
    assert "waits for: approval, or a host with headroom" in shown[0]
    assert "approval, or a host with headroom" in shown[1] and "approval" in shown[2]


def test_a_patient_job_s_details_say_when_its_estimate_was_made():
    """The UI's "Starts in about 1 s" stayed frozen at the moment the job joined the line (37 s
    later it still said 1 s): the details are written when something changes for the job, so
    the estimate says when it was made."""
    from datetime import timedelta

    from spillway.core.ledger import BudgetView

    plan = Plan(
        job_id="job-1",
        state="queued",
        queue=QueueSpot(position=1, ahead=0, eta_s=1.0),
        patience_until=NOW + timedelta(minutes=10),
        budget=BudgetView(estimate_usd=0.28, provider="minimax"),
    )
    details = texts.current_details(plan)
    assert "Starts in about 1 s here (estimated when it joined the line), or $0.28" in details
    assert "`spillway queue` shows the line now" in details


def test_an_estimate_under_a_second_is_about_1_s_and_one_of_now_is_none():
    """A clean clone's fast renders gave a job 2nd in line an estimate of 0.3 s, which read as
    no estimate at all."""
    from spillway.core.decision import about

    assert about(0.3) == ", about 1 s"
    assert about(0.0) == "" and about(None) == ""
    assert about(200.0) == ", about 3 min"
