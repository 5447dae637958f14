"""The GPU pool's book with several teams (docs/design.md, "A studio of several teams"): a freed
place goes by the teams' shares, one team alone takes every place, a team at its waiting limit
is refused, and what people see names the teams. Without a server."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from spillway.core.gpu_pool import HostSeen, PoolAnswer, PoolAsk, PoolHost, PoolInput, PoolLeave
from spillway.core.hosts import ref
from spillway.core.models import Plan, QueueSpot
from spillway.core.pool_book import PoolBook
from workflows import texts

T0 = datetime(2026, 12, 6, 9, 0, tzinfo=UTC)
FREE = [HostSeen(name="a40", reachable=True, headroom=True)]
NOW = timedelta(0)


def book(places: int = 1, max_waiting: dict[str, int] | None = None) -> PoolBook:
    b = PoolBook(PoolInput())
    b.configure([PoolHost(ref=ref("q", "a40", places), max_jobs=places)])
    b.set_teams({"film": 1.0, "ads": 1.0}, "film", max_waiting or {})
    return b


def ask(job: str, s: int = 0, **fields: object) -> PoolAsk:
    return PoolAsk.model_validate(
        {"job_id": job, "asked_at": T0 + timedelta(seconds=s), "seen": FREE} | fields
    )


def answers(sent: list[tuple[str, PoolAnswer]]) -> dict[str, PoolAnswer]:
    return dict(sent)


def end_render(b: PoolBook, at: datetime) -> list[str]:
    """The oldest holder gives its place back; the jobs admitted then."""
    held = min(b.holders.values(), key=lambda h: h.since)
    b.give_back(PoolLeave(job_id=held.job_id, asked_at=held.asked_at), at)
    return list(answers(b.admit(at, freshness=NOW)))


def test_a_team_that_asks_behind_another_s_burst_takes_the_next_freed_place_then_they_alternate():
    b = book(places=1)
    for i in range(6):
        b.ask(ask(f"film-{i}", i, team="film"), T0)
    b.ask(ask("ads-0", 10, team="ads"), T0)
    b.ask(ask("nobody-1", 11), T0)  # no team: the default, film
    b.ask(ask("ads-2", 12, team="ads"), T0)
    order = [j for n in range(8) for j in end_render(b, T0 + timedelta(seconds=60 * (n + 1)))]
    assert order == ["ads-0", "film-1", "ads-2", "film-2", "film-3", "film-4", "film-5", "nobody-1"]


def test_one_team_alone_takes_every_place_and_a_waiting_team_gets_the_next_one_freed():
    b = book(places=3)
    for i in range(5):
        b.ask(ask(f"film-{i}", i, team="film"), T0)
    assert sorted(h.job_id for h in b.holders.values()) == ["film-0", "film-1", "film-2"]
    b.ask(ask("ads-0", 10, team="ads"), T0)
    # film holds 3 places, ads none: ads' turn, though film's jobs asked first.
    assert end_render(b, T0 + timedelta(seconds=60)) == ["ads-0"]
    assert end_render(b, T0 + timedelta(seconds=61)) == ["film-3"]


def test_with_one_team_the_line_goes_as_it_always_did():
    b = PoolBook(PoolInput())
    b.configure([PoolHost(ref=ref("q", "a40", 1), max_jobs=1)])
    b.ask(ask("holder"), T0)
    for job, s, prio in [("p3-a", 1, 3), ("p3-b", 2, 3), ("p1", 4, 1)]:
        b.ask(ask(job, s, priority=prio), T0)
    order = [j for n in range(3) for j in end_render(b, T0 + timedelta(seconds=60 * (n + 1)))]
    assert order == ["p1", "p3-a", "p3-b"]
    # Nothing about teams is told with one team.
    lined = answers(b.ask(ask("late", 9), T0))["late"]
    assert lined.position == 1 and lined.team_places is None


def test_a_team_at_its_waiting_limit_is_refused_with_the_words_and_others_still_line_up():
    b = book(places=1, max_waiting={"ads": 2})
    b.ask(ask("holder", team="film"), T0)
    for i in range(2):
        assert answers(b.ask(ask(f"ads-{i}", 1 + i, team="ads"), T0))[f"ads-{i}"].position
    refused = answers(b.ask(ask("ads-2", 3, team="ads"), T0))["ads-2"]
    assert refused.refused == "team ads has 2 jobs waiting, its limit (max_waiting)"
    assert refused.host is None and refused.position is None
    assert [a.job_id for a in b.line] == ["ads-0", "ads-1"]
    # Another team waits on; an ads job already in line that asks again is never refused.
    assert answers(b.ask(ask("film-1", 4, team="film"), T0))["film-1"].position == 3
    again = answers(b.ask(ask("ads-1", 2, team="ads", mode="headroom"), T0))
    assert again["ads-1"].refused is None and again["ads-1"].position == 2
    # An armed job that would not wait goes to the cloud as ever: it is not lined, not refused.
    full = answers(b.ask(ask("ads-3", 5, team="ads", wait=False), T0))["ads-3"]
    assert full.refused is None and full.full == ["gpu_places_full_a40_1of1"]
    # Once one leaves the line, the next is lined.
    end_render(b, T0 + timedelta(seconds=60))
    assert answers(b.ask(ask("ads-4", 6, team="ads"), T0))["ads-4"].position is not None


def test_the_view_names_the_teams_and_a_waiting_job_hears_its_team_s_places():
    b = book(places=1)
    b.ask(ask("film-0", 0, team="film"), T0)
    lined = answers(b.ask(ask("ads-0", 1, team="ads"), T0))["ads-0"]
    assert lined.team_places == 0
    lined = answers(b.ask(ask("film-1", 2), T0))["film-1"]
    assert lined.team_places == 1
    view = b.view(T0)
    assert [(p.job_id, p.team) for p in view.hosts[0].places] == [("film-0", "film")]
    assert [(i.job_id, i.team) for i in view.line] == [("ads-0", "ads"), ("film-1", "film")]
    spot = b.spot("film-1", T0)
    assert spot is not None and spot.team_places == 1
    assert b.held_by_team() == {"film": 1, "ads": 0}
    assert b.waiting_by_team() == {"film": 1, "ads": 1}


def test_the_teams_turns_are_carried_across_continue_as_new():
    b = book(places=1)
    b.ask(ask("film-0", 0, team="film"), T0)
    b.ask(ask("film-1", 1, team="film"), T0)
    carried = b.carried(500, [])
    again = PoolBook(PoolInput.model_validate_json(carried.model_dump_json()))
    again.configure([PoolHost(ref=ref("q", "a40", 1), max_jobs=1)])
    again.set_teams({"film": 1.0, "ads": 1.0}, "film", {})
    again.ask(ask("ads-0", 2, team="ads"), T0)
    # film was served last: ads' turn comes first, though film-1 asked before it.
    assert end_render(again, T0 + timedelta(seconds=60)) == ["ads-0"]
    assert [h.team for h in again.holders.values()] == ["ads"]


def test_the_ui_names_the_teams_where_there_are_several_and_a_waiting_job_its_team_s_places():
    b = book(places=1)
    b.ask(ask("film-0", 0, team="film"), T0)
    lined = answers(b.ask(ask("ads-0", 1, team="ads"), T0))["ads-0"]
    teams = {"film": (1, 0), "ads": (0, 1)}
    details = texts.pool_details(b.view(T0), 1, teams)
    assert "`film-0` (film)" in details
    assert "- `ads`: 0 places held, 1 waiting" in details
    assert "- `film`: 1 place held, 0 waiting" in details
    assert "1. `ads-0` (priority 3, team ads" in details
    # With one team nothing about teams is said.
    alone = texts.pool_details(b.view(T0), 1, None)
    assert "(film)" not in alone and "team" not in alone.lower()
    spot = QueueSpot(position=1, ahead=0, eta_s=None, team_places=lined.team_places)
    waiting = Plan(job_id="ads-0", state="queued", team="ads", queue=spot)
    assert "Team `ads` held 0 places of the GPUs then." in texts.current_details(waiting)
    one_team = Plan(
        job_id="j", state="queued", team="studio", queue=QueueSpot(position=1, ahead=0, eta_s=None)
    )
    assert "Team" not in texts.current_details(one_team)


def test_a_team_the_file_does_not_name_counts_as_the_default_team():
    """A job started before the teams file has the team `studio`, which the file may not name."""
    b = book(places=2)
    b.ask(ask("old", 0, team="studio"), T0)
    b.ask(ask("film-1", 1, team="film"), T0)
    assert b.held_by_team() == {"film": 2, "ads": 0}
