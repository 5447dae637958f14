"""Scenario 7: a distinctive MINIMAX_API_KEY (every worker of this suite holds it, and so does
every `spillway` command's environment) never shows in what a person or a tool can read:
histories (payloads decoded), worker logs, the workers' Prometheus metrics, CLI output and the
Temporal UI's API, across every scenario of the suite. Runs after the other scenarios of its
process (tests/conftest.py orders them): it reads the texts they left in `sightings`, adds its own
cloud jobs (one where MiniMax echoes the key in its error messages) and checks everything
together; each process checks what its scenarios left once more at its end (conftest.py), so
the scenarios other processes ran are checked there.
"""

from __future__ import annotations

import httpx
from aiohttp import web

from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from tests.reliability.harness import SECRETS, DevServer, Sightings, cli
from tests.support.cli import decoded, temporal_show
from tests.support.constants import BUSY_VRAM_PCT, CANARY_KEY

KINDS = {"worker log", "metrics", "cli", "history", "ui api", "webhook"}
# A password in a URL's user-info, distinctive: the final check looks for SECRETS[1] in it.
PASSWORD = f"{SECRETS[1]}-url-password"


async def test_a_password_in_a_failing_url_shows_nowhere(
    workers,
    jobs_on,
    comfyui: ComfyUISim,
    sightings: Sightings,
    refused_url: str,
):
    comfyui.set_vram_used_pct(BUSY_VRAM_PCT)  # overloaded and not armed: the webhook is sent
    notices: list[str] = []

    async def hook(request: web.Request) -> web.Response:
        notices.append(await request.text())
        return web.Response()

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    guard = refused_url.replace("http://", f"http://ops:{PASSWORD}@")
    try:
        worker = await workers(
            COMFYUI_URL=comfyui.url.replace("http://", f"http://ops:{PASSWORD}@"),
            A40_GUARD_URL=guard,
            APPROVAL_WEBHOOK_URL=f"http://127.0.0.1:{port}/hook",
            APPROVAL_TIMEOUT_S=2,
        )
        jobs = jobs_on(worker)
        job_id = await jobs.submit("secrets: a guard URL with a password that fails")
        plan = await jobs.finished(job_id)
    finally:
        await runner.cleanup()
    assert (plan.state, plan.route) == ("completed", "local")  # the approval window closed
    assert plan.overflow.last_signal is not None
    [error] = [e for e in plan.overflow.last_signal.errors if e.startswith("guard:")]
    assert refused_url.removeprefix("http://") in error and "ops" not in error  # host, no user
    [notice] = notices
    assert "guard: no answer from" in notice
    sightings.add(f"webhook: approval notice of {job_id}", notice)
    sightings.add(f"cli: plan of {job_id}", plan.model_dump_json())
    for args in (("status", job_id, "--json"), ("health",), ("health", "--json"), ("load",)):
        code, _, err = await cli(sightings, *args, env=worker.env)
        assert code in (0, 1), err
    code, _, err = await cli(sightings, "health", env=worker.env | {"A40_GUARD_URL": f"{guard}:x"})
    assert code == 2 and "A40_GUARD_URL" in err
    sightings.add(f"worker log: {worker.task_queue}", worker.log)
    # The final check (below) reads this job's history and UI answers too.


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

    # Every job of the scenarios before this one on this server (in this process, when the
    # suite runs in several: each sweeps what its own scenarios left when its session ends, see
    # conftest.py): its history and what the UI shows of it.
    await sightings.sweep(temporal_server)
    async with httpx.AsyncClient() as http:
        listing = await http.get(f"{temporal_server.api()}/workflows", timeout=10)
        sightings.add("ui api: the workflow list", decoded(listing.json()))

    assert sightings.kinds() >= KINDS
    assert sightings.leaks() == [], f"the key ({SECRETS[1]}) leaked into these"
