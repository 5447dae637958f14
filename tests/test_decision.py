"""Every row of the decision table (docs/design.md, "The decision";
spillway.core.decision.TABLE), the README and `spillway health` showing that same table, and the
fail-open cases around it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from spillway.cli.health import DECISION
from spillway.client.new_jobs import duration_s, moment
from spillway.core.decision import (
    TABLE,
    Row,
    decide,
    is_armed,
    patience_s,
    places_taken,
    table_rows,
)
from spillway.core.errors import ConfigError
from spillway.core.models import LoadStatus, Thresholds, VideoJob
from spillway.core.settings import PROJECT_ROOT


def load(reachable: bool, overloaded: bool, reasons: list[str] | None = None) -> LoadStatus:
    if reasons is None:
        reasons = ["vram_used_91.0pct_ge_85.0pct"] if overloaded else []
        if not reachable:
            reasons = ["comfyui_unreachable", *reasons]
    return LoadStatus(
        reachable=reachable,
        overloaded=overloaded,
        reasons=reasons,
        measured_at=datetime(2026, 11, 29, tzinfo=UTC),
        thresholds=Thresholds(vram_busy_pct=85, util_busy_pct=95),
    )


@pytest.mark.parametrize(
    ("reachable", "overloaded", "armed", "route", "trigger"),
    [
        (True, False, False, "local", None),
        (True, False, True, "local", None),
        (True, True, True, "cloud", "overloaded"),
        (True, True, False, "await", "overloaded"),
        (False, False, True, "cloud", "unreachable"),
        (False, True, True, "cloud", "unreachable"),
        (False, False, False, "await", "unreachable"),
        (False, True, False, "await", "unreachable"),
    ],
)
def test_decision_table(reachable, overloaded, armed, route, trigger):
    decision = decide(load(reachable, overloaded), armed)
    assert (decision.route, decision.trigger) == (route, trigger)
    if route != "local":
        assert decision.reasons == load(reachable, overloaded).reasons


def test_a_probe_whose_sources_all_failed_routes_local_even_when_armed():
    # Fail-open: errors make no "overloaded", so a broken measurement never spends money.
    broken = load(True, False, reasons=[])
    broken.errors.extend(["system_stats: HTTP 500", "queue: HTTP 500", "nvml: absent"])
    assert decide(broken, armed=True).route == "local"


@pytest.mark.parametrize("row", TABLE, ids=lambda r: r.says)
def test_decide_follows_every_row_of_the_one_written_table(row: Row):
    for overloaded in (True, False) if row.overloaded is None else (row.overloaded,):
        for armed in (True, False) if row.armed is None else (row.armed,):
            assert decide(load(row.reachable, overloaded), armed).route == row.route


def test_the_readme_and_health_show_the_same_table():
    readme = (PROJECT_ROOT / "README.md").read_text(encoding="utf-8")
    header = "| ComfyUI reachable | overloaded | armed | route |"
    block = readme.split(header, 1)[1].split("\n\n", 1)[0]
    rows = [
        tuple(cell.strip() for cell in line.strip("|").split("|"))
        for line in block.strip().splitlines()[1:]  # the |---| line first
    ]
    assert rows == table_rows()
    assert [f"reachable {r}, overloaded {o}, armed {a} -> {t}" for r, o, a, t in rows] == DECISION


def test_armed_is_one_definition_used_by_the_worker_and_the_job():
    assert not is_armed(fallback_enabled=True, key_present=True, has_cloud_request=False)
    assert not is_armed(fallback_enabled=True, key_present=False, has_cloud_request=True)
    assert not is_armed(fallback_enabled=False, key_present=True, has_cloud_request=True)
    assert is_armed(fallback_enabled=True, key_present=True, has_cloud_request=True)


FULL = ["gpu_places_full_a40_local_2of2"]


@pytest.mark.parametrize(
    ("reachable", "overloaded", "armed", "route"),
    [
        (True, False, True, "cloud"),  # every place taken: overloaded, so armed goes to the cloud
        (True, False, False, "await"),
        (True, True, False, "await"),
        (False, False, True, "cloud"),
    ],
)
def test_every_place_taken_counts_as_overloaded(
    reachable: bool, overloaded: bool, armed: bool, route: str
):
    reading = load(reachable, overloaded)
    seen = places_taken(reading, FULL)
    decision = decide(seen, armed=armed)
    assert decision.route == route
    if reachable and not overloaded:
        assert seen.overloaded and decision.reasons == FULL
    else:
        assert seen == reading  # already overloaded or unreachable: the probe's reasons stand


T = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("fields", "overflow_after_s", "patience"),
    [
        ({}, 0.0, None),  # today's rule: overflow as soon as the places are full
        ({}, 300.0, 300.0),  # the studio's default
        ({"max_wait_s": 90}, 300.0, 90.0),  # the job's own wins
        ({"max_wait_s": 0}, 300.0, None),  # 0: at once
        ({"deadline": T + timedelta(minutes=10)}, 0.0, 600.0),
        ({"deadline": T - timedelta(minutes=1)}, 300.0, 0.0),  # past: no patience left
    ],
)
def test_a_job_s_patience(fields: dict[str, Any], overflow_after_s: float, patience: float | None):
    job = VideoJob(job_id="j", graph={"1": {"class_type": "EmptyImage"}}, **fields)
    assert patience_s(job, overflow_after_s, T) == patience


def test_a_patience_is_read_from_the_command_line_or_refused_naming_it():
    assert [duration_s(v) for v in ("90", "90s", "10m", "2h", 1.5)] == [90, 90, 600, 7200, 1.5]
    assert moment("2026-12-05T18:00:00Z") == datetime(2026, 12, 5, 18, tzinfo=UTC)
    for bad, message in [("soon", "--max-wait 'soon'"), ("-5m", "durations are never negative")]:
        with pytest.raises(ConfigError, match=message):
            duration_s(bad)
    for bad, message in [("tomorrow", "ISO 8601"), ("2026-12-05T18:00:00", "its zone")]:
        with pytest.raises(ConfigError, match=message):
            moment(bad)
    with pytest.raises(ValueError, match="max_wait_s or deadline, not both"):
        VideoJob(job_id="j", graph={"1": {"class_type": "X"}}, max_wait_s=1, deadline=T)
