"""Every row of DESIGN.md's decision table, and the fail-open cases around it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from spillway.decision import decide
from spillway.models import LoadStatus, Thresholds


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
