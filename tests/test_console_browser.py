"""The studio console in headless Chromium, on the real dev server with a worker, its ComfyUI
double as the one GPU host (one place) and the MiniMax double as the cloud: the page shows a
render and its progress moving, jobs entering the line and waiting for a person; a person signs
in with their token, approves one job by a click and sees it go to the cloud, rejects another,
and cancels a job in the line and the render. Then the page against answers made up to attack
it: markup in every field stays text, a slow read is not asked again before it answers, a
refusal is shown with its message, and Enter in a reason field acts on nothing."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from spillway.client import SpillwayClient
from spillway.console.app import Act, ActBody, ApiError, Console, create_app
from spillway.console.people import People
from spillway.console.sessions import Signer
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from tests.support.browser import Page
from tests.support.console import console_app, serving_console
from tests.support.constants import CANARY_KEY
from tests.support.gpu_line import Spillway
from tests.support.gpu_line import spillway_fixture as spillway_fixture  # the `spillway` fixture
from tests.support.graphs import VIDEO_GRAPH

pytestmark = pytest.mark.timeout(420)


def row(section: str, job_id: str) -> str:
    return f"#{section} tr[data-job={json.dumps(job_id)}]"


def shows(section: str, job_id: str, text: str = "") -> str:
    """A JS condition: the section's row of the job is there (and holds `text`)."""
    selector = json.dumps(row(section, job_id))
    return (
        f"(() => {{ const r = document.querySelector({selector}); "
        f"return !!r && r.innerText.includes({json.dumps(text)}); }})()"
    )


def gone(section: str, job_id: str) -> str:
    return f"!document.querySelector({json.dumps(row(section, job_id))})"


async def render_brief(page: Page, job_id: str) -> str:
    brief = await page.js(
        f"(() => {{ const r = document.querySelector({json.dumps(row('renders', job_id))}); "
        "return r ? r.querySelector('.brief').innerText : ''; })()"
    )
    return str(brief or "")


async def test_the_console_shows_the_line_and_a_person_approves_rejects_and_cancels_by_click(
    spillway: Any,
    comfyui: ComfyUISim,
    minimax: MiniMaxSim,
    browser: Page,
    tmp_path: Path,
):
    # A long render that reports each sampler step and stops at the next one when interrupted.
    comfyui.execution_s = 240.0
    comfyui.progress_nodes |= {node["class_type"] for node in VIDEO_GRAPH.values()}
    comfyui.progress_steps = 240
    async with spillway(A40_MAX_JOBS=1) as sw:
        sw_: Spillway = sw
        app, people = console_app(sw_.client, sw_.queue, tmp_path / "secrets")
        token = people.add("ana")
        async with serving_console(app) as url:
            await browser.goto(url)
            holder = await sw_.start(cloud=False)
            # The render, and its progress moving.
            await browser.until(shows("renders", holder.id, "%"), what="the render's progress")
            first = await render_brief(browser, holder.id)
            selector = json.dumps(f"{row('renders', holder.id)} .brief")
            moved = f"document.querySelector({selector})?.innerText !== {json.dumps(first)}"
            await browser.until(moved, what=f"the render's progress moving on from {first!r}")

            # Jobs entering the line: two wait for a person (the cloud is not armed), one local.
            asking = await sw_.start(cloud=True)
            rejecting = await sw_.start(cloud=True)
            for job in (asking, rejecting):
                await browser.until(shows("awaiting", job.id, "$"), what=f"{job.id}'s quote")
                await browser.until(shows("line", job.id), what=f"{job.id} in the line")
            local = await sw_.start(cloud=False)
            await browser.until(shows("line", local.id, "queued"), what=f"{local.id} queued")
            # Nobody has signed in: the page offers no act.
            assert not await browser.js("!!document.querySelector('button[data-act]')")

            # Signing in with the token.
            await browser.goto(f"{url}/signin")
            await browser.type("#token", token)
            await browser.click("#signin")
            await browser.until("document.getElementById('person')?.innerText === 'ana'")
            await browser.until(shows("awaiting", asking.id, "$"))

            # Approve by click: the job goes to the MiniMax double and completes there.
            await browser.click(f"{row('awaiting', asking.id)} button[data-act=approve]")
            await browser.until(gone("awaiting", asking.id), what="the approved job leaving")
            await browser.until(
                shows("recent", asking.id, "completed"), what="the approved job completed"
            )
            assert "cloud" in await browser.text(row("recent", asking.id))
            assert sum(minimax.create_calls_by_prompt.values()) == 1
            # Its cost is today's bar in the spend chart, for its team.
            await browser.until("!!document.querySelector('#spend svg rect.team0')")
            assert "studio" in await browser.text("#spend")

            # Reject, with a reason typed into its form: the job stays in line for a GPU.
            await browser.type(f"{row('awaiting', rejecting.id)} input[name=reason]", "no budget")
            await browser.click(f"{row('awaiting', rejecting.id)} button[data-act=reject]")
            await browser.until(shows("line", rejecting.id, "queued"), what="the rejected job")
            rejected = await sw_.jobs.status(rejecting.id)
            assert rejected.approval is not None
            assert (rejected.approval.approved, rejected.approval.by) == (False, "ana")
            assert rejected.approval.reason == "no budget"

            # Cancel a job in the line, then the render itself.
            await browser.click(f"{row('line', local.id)} button[data-act=cancel]")
            await browser.until(shows("recent", local.id, "cancelled"), what="the cancelled job")
            await browser.click(f"{row('renders', holder.id)} button[data-act=cancel]")
            await browser.until(shows("recent", holder.id, "cancelled"), what="the render ended")
            # The rejected job takes the place; it is cancelled too, so nothing is left running.
            await browser.until(shows("renders", rejecting.id), what="the place handed on")
            await browser.click(f"{row('renders', rejecting.id)} button[data-act=cancel]")
            await browser.until(shows("recent", rejecting.id, "cancelled"))

            html = await browser.js("document.documentElement.outerHTML")
            assert CANARY_KEY not in html  # the MiniMax key never reaches the page
            cancelled = await sw_.jobs.status(local.id)
            assert cancelled.cancelled_by is not None and cancelled.cancelled_by.by == "ana"
    assert sum(minimax.create_calls_by_prompt.values()) == 1


# Markup a job id, team, reason or host name could carry: it must stay text.
MARKUP = '<img src="x" id="injected"><b id="bold">bold</b>'

# The most reads of /api/queue the page has had in flight at once, from now on.
COUNT_READS = """(() => {
  const fetched = window.fetch;
  let now = 0;
  window.mostReads = 0;
  window.fetch = async (path, ...rest) => {
    if (path !== "/api/queue") return fetched(path, ...rest);
    window.mostReads = Math.max(window.mostReads, ++now);
    try {
      return await fetched(path, ...rest);
    } finally {
      now--;
    }
  };
})()"""


@dataclass
class MadeUp(Console):
    """A console whose reads and acts answer what the test says."""

    slow_s: float = 0.0
    problems: list[str] = field(default_factory=list)
    acts: list[tuple[str, str, str]] = field(default_factory=list)

    async def queue(self) -> dict[str, Any]:
        await asyncio.sleep(self.slow_s)
        host: dict[str, Any] = {
            "name": MARKUP,
            "max_jobs": 1,
            "reachable": True,
            "drained": None,
            "places": [],
        }
        item = {
            "position": 1,
            "job_id": MARKUP,
            "team": MARKUP,
            "priority": 3,
            "state": "queued",
            "why": MARKUP,
            "eta_s": None,
            "since": None,
        }
        return {"pool": "running", "closed": None, "hosts": [host], "line": [item]}

    async def board(self) -> dict[str, Any]:
        recent = {
            "job_id": MARKUP,
            "state": MARKUP,
            "route": None,
            "host": None,
            "started": None,
            "link": "javascript:document.title='clicked'",
        }
        awaiting = {
            "job_id": "job-1",
            "team": MARKUP,
            "reasons": [MARKUP],
            "trigger": None,
            "estimate_usd": 1.5,
            "provider": MARKUP,
            "day_remaining_usd": 10.0,
        }
        spend = {"teams": [], "days": [], "today_spent_usd": 0.0, "day_budget_usd": None}
        return {
            "recent": [recent],
            "awaiting": [awaiting],
            "renders": [],
            "spend": spend,
            "problems": self.problems,
        }

    async def act(self, act: Act, job_id: str, by: str, body: ActBody) -> dict[str, Any]:
        self.acts.append((act, job_id, by))
        await asyncio.sleep(1.0)
        raise ApiError(409, f"job {job_id} is not awaiting approval (state: queued)")


async def test_the_page_keeps_data_as_text_asks_one_read_at_a_time_and_shows_refusals(
    browser: Page, tmp_path: Path
):
    people = People(tmp_path / "secrets")
    console = MadeUp(
        client=cast(SpillwayClient, None),  # every read and act is made up
        people=people,
        signer=Signer(b"console test key"),
        open_read=True,
        ui_url="http://ui.test:8233",
        problems=["the ledger <i>did not</i> answer"],
    )
    token = people.add("ana")
    async with serving_console(create_app(console)) as url:
        await browser.goto(f"{url}/signin")
        await browser.type("#token", token)
        await browser.click("#signin")
        await browser.until("document.getElementById('person')?.innerText === 'ana'")

        # Markup from the API is shown as text, everywhere; a javascript: link is no link.
        for section in ("hosts", "line", "awaiting", "recent"):
            await browser.until(
                f"document.getElementById({json.dumps(section)}).innerText.includes('<img')",
                what=f"the markup as text in {section}",
            )
        assert await browser.js("document.querySelectorAll('#injected, #bold, main i').length") == 0
        assert await browser.js("document.querySelector('#recent a')") is None

        # A read's problem is shown while it lasts, and leaves once it has cleared.
        problems = "document.getElementById('problems')"
        await browser.until(f"!{problems}.hidden && {problems}.innerText.includes('<i>did not')")
        console.problems = []
        await browser.until(f"{problems}.hidden", what="the problem gone")

        # Reads slower than the polling: each waits for the last, none stack up. Counted in the
        # page: Chromium's cache would hold a second read of the URL until the first answers.
        await browser.js(COUNT_READS)
        console.slow_s = 4.0
        await asyncio.sleep(7.0)
        assert await browser.js("window.mostReads") == 1
        console.slow_s = 0.0

        # Enter in a reason field: implicit submission would click Approve, the first button.
        reason = f"{row('awaiting', 'job-1')} input[name=reason]"
        await browser.type(reason, "keep it local")
        for kind in ("keyDown", "keyUp"):
            await browser.call(
                "Input.dispatchKeyEvent",
                type=kind,
                key="Enter",
                code="Enter",
                windowsVirtualKeyCode=13,
                text="\r",
            )
        await asyncio.sleep(1.5)
        assert console.acts == []

        # Two quick clicks send one act (with the session's CSRF token, or the console would
        # answer 403 before acting), and its refusal is shown with the API's message.
        approve = json.dumps(f"{row('awaiting', 'job-1')} button[data-act=approve]")
        await browser.js(f"document.querySelector({approve}).click()")
        await browser.js(f"document.querySelector({approve})?.click()")
        refused = "approve job-1 refused (409): job job-1 is not awaiting approval (state: queued)"
        await browser.until(
            f"document.getElementById('acted').innerText === {json.dumps(refused)}",
            what="the refusal",
        )
        assert console.acts == [("approve", "job-1", "ana")]
