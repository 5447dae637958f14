"""The studio console in headless Chromium, on the real dev server with a worker, its ComfyUI
double as the one GPU host (one place) and the MiniMax double as the cloud: the page shows a
render and its progress moving, jobs entering the line and waiting for a person; a person signs
in with their token, approves one job by a click and sees it go to the cloud, rejects another,
and cancels a job in the line and the render."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

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
