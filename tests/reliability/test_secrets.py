"""Scenario 7: a distinctive MINIMAX_API_KEY (every worker of this suite holds it, and so does
every `spillway` command's environment) never shows in what a person or a tool can read:
histories (payloads decoded), worker logs, the workers' Prometheus metrics, CLI output and the
Temporal UI's API, across every scenario of the suite. Runs last (see conftest.py): it reads the
texts the other scenarios left in `sightings`, adds its own cloud jobs (one where MiniMax echoes
the key in its error messages) and checks everything together.
"""

from __future__ import annotations

import asyncio

import httpx

from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from tests.reliability.harness import SECRETS, DevServer, Sightings, api_texts, cli, history_text
from tests.support.cli import decoded, temporal_show
from tests.support.constants import BUSY_VRAM_PCT, CANARY_KEY

KINDS = {"worker log", "metrics", "cli", "history", "ui api"}


async def test_the_key_never_shows_in_histories_logs_metrics_cli_output_or_the_ui_api(
    workers,
    jobs_on,
    comfyui: ComfyUISim,
    minimax: MiniMaxSim,
    sightings: Sightings,
    temporal_server: DevServer,
):
    comfyui.set_vram_used_pct(BUSY_VRAM_PCT)
    worker = await workers(
        COMFYUI_URL=comfyui.url, MINIMAX_BASE_URL=minimax.url, CLOUD_VIDEO_FALLBACK_ENABLED=1
    )
    jobs = jobs_on(worker)
    # MiniMax echoing the Authorization header back in its messages, as some gateways do.
    minimax.inject("query", 1002, f"rate limit for Bearer {CANARY_KEY}")
    paid = await jobs.submit("secrets: an armed cloud job")
    plan = await jobs.finished(paid)
    assert (plan.state, plan.route) == ("completed", "cloud")
    minimax.inject("create", 2049, f"invalid api key {CANARY_KEY}")
    refused = await jobs.submit("secrets: a create refused with the key in the message")
    plan = await jobs.finished(refused)
    assert plan.state == "failed" and plan.error is not None
    assert "invalid api key [MINIMAX_API_KEY]" in plan.error  # seen, and masked
    assert {r.auth for r in minimax.requests if r.endpoint != "download"} == {"ok"}  # key used

    for args in (
        ("status", paid, "--json"),
        ("status", refused),
        ("watch", paid),
        ("list", "--json"),
        ("health", "--json"),
        ("health",),
        ("load",),
    ):
        code, _, err = await cli(sightings, *args, env=worker.env)
        assert code in (0, 1), err
    code, _, err = await cli(sightings, "health", env=worker.env | {"MINIMAX_BASE_URL": "x"})
    assert code == 2 and "MINIMAX_BASE_URL" in err
    for job_id in (paid, refused):
        sightings.add(
            f"history: temporal workflow show {job_id}", await temporal_show(worker.env, job_id)
        )
    sightings.add(f"metrics: worker {worker.task_queue}", await worker.metrics())
    sightings.add(f"worker log: {worker.task_queue}", worker.log)

    # Every job of the suite on this server: its history and what the UI shows of it.
    limit = asyncio.Semaphore(8)

    async def read(http: httpx.AsyncClient, job_id: str) -> None:
        async with limit:
            sightings.add(f"history: {job_id}", await history_text(temporal_server.client, job_id))
            sightings.add(f"ui api: {job_id}", await api_texts(http, temporal_server.api(), job_id))

    async with httpx.AsyncClient() as http:
        await asyncio.gather(*(read(http, job_id) for job_id in sightings.jobs))
        listing = await http.get(f"{temporal_server.api()}/workflows", timeout=10)
        sightings.add("ui api: the workflow list", decoded(listing.json()))

    assert sightings.kinds() >= KINDS
    assert sightings.leaks() == [], f"the key ({SECRETS[1]}) leaked into these"
