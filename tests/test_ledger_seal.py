"""The seal on a spend ledger's input (spillway/core/ledger_seal.py): made with the workers' secret
for one ledger id, over the whole input, and fresh only just before the run it starts; and
`spillway health`'s word on workers that do not seal."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
from temporalio.testing import ActivityEnvironment

from activities.policy import PolicyActivities, PolicyRequest
from spillway.cli.health import UNSEALED, BudgetHealth, WorkersHealth, ledger_seal_health
from spillway.core.ledger import LedgerInput
from spillway.core.ledger_seal import SEAL_FRESH, sealed, why_not_sealed
from spillway.core.models import WorkersView
from spillway.core.tiers import load_tiers
from tests.support.settings import KEY, make_settings

SECRET = "0123456789abcdef0123456789abcdef"
LEDGER = "spillway-spend-ledger-spillway"
NOW = datetime(2026, 12, 4, 9, 0, tzinfo=UTC)


def a_restore() -> LedgerInput:
    return LedgerInput(spent={"2026-12": 12.5, "2026-12-04": 1.4}, created={"2026-12": "ab12"})


def test_a_fresh_seal_of_the_workers_secret_holds_after_a_trip_through_json():
    made = sealed(SECRET, LEDGER, a_restore(), NOW)
    carried = LedgerInput.model_validate_json(made.model_dump_json())  # as the server keeps it
    assert why_not_sealed(SECRET, LEDGER, carried, NOW + timedelta(seconds=2)) is None


@pytest.mark.parametrize(
    "forged",
    [
        {"spent": {"2026-12": 0.0}},  # a month's spending erased
        {"created": {}},  # the created tags dropped
        {"updates_per_run": 1},
        {"sealed_after": "another-run"},  # made to follow another run
    ],
)
def test_an_input_changed_after_sealing_is_not_sealed(forged: dict[str, object]):
    made = sealed(SECRET, LEDGER, a_restore(), NOW).model_copy(update=forged)
    why = why_not_sealed(SECRET, LEDGER, made, NOW)
    assert why is not None and "seal is not the workers'" in why


def test_a_seal_for_another_ledger_or_of_another_secret_is_not_sealed():
    made = sealed(SECRET, LEDGER, a_restore(), NOW)
    assert why_not_sealed(SECRET, "spillway-spend-ledger-other", made, NOW) is not None
    assert why_not_sealed("another secret of 32 characters!", LEDGER, made, NOW) is not None
    assert why_not_sealed(SECRET, LEDGER, a_restore(), NOW) == "its input carries no seal"


def test_a_seal_copied_into_a_later_start_is_stale():
    made = sealed(SECRET, LEDGER, a_restore(), NOW)
    why = why_not_sealed(SECRET, LEDGER, made, NOW + SEAL_FRESH + timedelta(seconds=1))
    assert why is not None and "copied from another start" in why


def test_what_a_continue_as_new_marks_is_not_part_of_the_seal():
    made = sealed(SECRET, LEDGER, a_restore(), NOW)
    assert made.trusted is None
    marked = made.model_copy(update={"trusted": True})
    assert why_not_sealed(SECRET, LEDGER, marked, NOW) is None


@pytest.mark.parametrize(
    ("keys", "secret", "warned"),
    [({}, None, False), (KEY, None, True), (KEY, SECRET, False)],
)
async def test_health_warns_of_workers_whose_ledger_takes_unsealed_input(
    keys: dict[str, str], secret: str | None, warned: bool
):
    """As `spillway health` hears it from the workers' policy: keys and no ledger secret (a
    worker of an earlier release, which started without one)."""
    settings = make_settings(keys, SPILLWAY_LEDGER_SECRET=secret)
    activities = PolicyActivities(settings, load_tiers(settings.SPILLWAY_ROUTING_TIERS))
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, task_queue="spillway")
    policy = await env.run(activities.read_policy, PolicyRequest(job_id="j"))
    budget = BudgetHealth(daily_usd=None, monthly_usd=None)

    ledger_seal_health(budget, WorkersHealth(view=WorkersView(policy=policy, hosts=[])))

    assert (budget.unsealed == UNSEALED) is warned and (budget.unsealed is None) is not warned
