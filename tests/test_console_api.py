"""The studio console's JSON API against the real dev server with a worker running the route
stubs: the reads answer what the CLI's --json prints, the acts answer the job's status after
them, and every refusal is one line of JSON with its status (401, 403, 404, 400, 409, 413)."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import uuid
from pathlib import Path

import httpx
import pytest

from activities.minimax.activities import CREATE as MINIMAX_CREATE
from spillway.cli import commands
from spillway.client import jobs as job_ops
from spillway.client.queue import pool_view
from spillway.core.models import plan_json
from tests.support.cli import SPILLWAY, free_ports, spillway
from tests.support.console import asgi_client, console_app
from tests.support.jobs import Jobs, RunJobs, pool_settled
from tests.support.route_stubs import BUSY, FREE, RouteStubs
from tests.support.settings import KEY
from tests.support.waiting import until

# A key, the fallback not armed, an hour to decide: a job on a busy GPU waits for a person.
WAITS = KEY | {"APPROVAL_TIMEOUT_S": 3600}


def one_line_error(response) -> str:
    assert "\n" not in response.text.strip(), response.text
    message: str = response.json()["error"]
    return message


def teams_file(tmp_path: Path) -> Path:
    path = tmp_path / "teams.json"
    teams = {"default": "film", "teams": {"film": {"approvers": ["ana"]}, "ads": {}}}
    path.write_text(json.dumps(teams))
    return path


async def test_the_reads_answer_what_the_cli_prints_and_bad_reads_get_one_line(
    run_dev_jobs: RunJobs, tmp_path: Path, cli_env, dev_env
):
    async with run_dev_jobs(RouteStubs(FREE)) as jobs:
        # Another spillway's job in the same namespace: no worker polls its queue.
        elsewhere = await Jobs(jobs.client, f"other-{uuid.uuid4()}").start(prompt=None)
        job_id = await jobs.submit(prompt=None)
        await jobs.until(job_id, "completed")
        both = {elsewhere.id, job_id}

        async def listed() -> set[str]:
            query = f"WorkflowId IN ({', '.join(repr(i) for i in both)})"
            return {w.id async for w in jobs.client.list_workflows(query)}

        # Both are in the namespace's visibility: the board leaves the other out by its queue.
        await until(listed, lambda found: found == both)
        await pool_settled(jobs.client, jobs.task_queue)  # what both reads see stays put
        app, _ = console_app(jobs.client, jobs.task_queue, tmp_path / "secrets")
        async with asgi_client(app) as http:
            health = await http.get("/healthz")
            queue = await http.get("/api/queue")
            job = await http.get(f"/api/jobs/{job_id}")
            teams = await http.get("/api/teams")
            board = await http.get("/api/board")
            unknown_job = await http.get("/api/jobs/no-such-job")
            unknown_route = await http.get("/api/nothing-here")
            wrong_method = await http.delete("/api/queue")
            page = await http.get("/")
            script = await http.get("/static/console.js")
        env = cli_env(
            TEMPORAL_ADDRESS=dev_env.client.service_client.config.target_host,
            SPILLWAY_TASK_QUEUE=jobs.task_queue,
        )
        code, team_out, err = await spillway("team", "list", "--json", env=env)
        assert code == 0, err
        view = await pool_view(jobs.client, jobs.task_queue)
        plan = await job_ops.status(jobs.client, job_id)
        await elsewhere.terminate("test over")

    assert health.status_code == 200 and health.json() == {"ok": True}
    assert queue.status_code == 200
    assert queue.json() == json.loads(view.model_dump_json())  # `spillway queue --json`
    assert job.status_code == 200 and job.json() == json.loads(plan_json(plan))
    assert job.json()["state"] == "completed"
    assert teams.status_code == 200 and teams.json() == json.loads(team_out)
    # The newest jobs of the console's task queue, not the namespace's.
    recent = {r["job_id"]: r for r in board.json()["recent"]}
    assert list(recent) == [job_id]
    assert recent[job_id]["state"] == "completed"
    assert recent[job_id]["link"] == f"http://ui.test:8233/namespaces/default/workflows/{job_id}"
    assert board.json()["problems"] == []

    assert unknown_job.status_code == 404
    assert one_line_error(unknown_job) == "job no-such-job not found"
    assert unknown_route.status_code == 404 and "/api/nothing-here" in one_line_error(unknown_route)
    assert wrong_method.status_code == 405 and one_line_error(wrong_method)
    assert page.status_code == 200 and "/static/console.js" in page.text
    # Nothing from the network: the page may load only what its own origin serves.
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert "http" not in page.text.split("<body>")[1].replace('data-ui="http://ui.test', "")
    assert script.status_code == 200 and "/api/queue" in script.text


async def test_acting_needs_a_person_an_approver_and_a_job_waiting_for_the_act(
    run_dev_jobs: RunJobs, tmp_path: Path
):
    stubs = RouteStubs(BUSY)
    teams = teams_file(tmp_path)  # the workers' and the console's
    async with run_dev_jobs(stubs, **WAITS, SPILLWAY_TEAMS_FILE=teams) as jobs:
        waiting = [await jobs.submit(prompt="a lighthouse") for _ in range(3)]
        for job_id in waiting:
            await jobs.until(job_id, "awaiting_approval")
        app, people = console_app(
            jobs.client,
            jobs.task_queue,
            tmp_path / "secrets",
            SPILLWAY_TEAMS_FILE=teams,
        )
        ana, bob = people.add("ana"), people.add("bob")
        first, second, third = waiting
        async with asgi_client(app) as http:

            async def act(job_id: str, what: str, token: str | None, **kw):
                headers = {} if token is None else {"Authorization": f"Bearer {token}"}
                return await http.post(f"/api/jobs/{job_id}/{what}", headers=headers, **kw)

            nobody = await act(first, "approve", None)
            forged = await act(first, "approve", "spw_" + uuid.uuid4().hex)
            not_bearer = await http.post(
                f"/api/jobs/{first}/approve", headers={"Authorization": "Basic eDp5"}
            )
            bad_json = await act(first, "approve", ana, content=b"{not json")
            bad_field = await act(first, "approve", ana, json={"why": "x"})
            too_big = await act(first, "approve", ana, json={"reason": "x" * 70_000})
            not_approver = await act(first, "approve", bob, json={"reason": "deadline"})
            unknown = await act("no-such-job", "approve", ana)
            no_act = await act(first, "launch", ana)
            refused_so_far = [(await jobs.status(job_id)).state for job_id in waiting]

            approved = await act(first, "approve", ana, json={"reason": "client deadline"})
            again = await act(first, "approve", ana)
            rejected = await act(second, "reject", bob, json={"reason": "keep it local"})
            cancelled = await act(third, "cancel", bob, json={"reason": "not needed"})
            cancelled_again = await act(third, "cancel", bob)
        done = await jobs.finished(first)

    assert nobody.status_code == 401 and "Bearer" in one_line_error(nobody)
    assert forged.status_code == 401 and one_line_error(forged)
    assert not_bearer.status_code == 401
    assert bad_json.status_code == 400 and "not JSON" in one_line_error(bad_json)
    assert bad_field.status_code == 400 and "why" in one_line_error(bad_field)
    assert too_big.status_code == 413 and "64 KB" in one_line_error(too_big)
    assert not_approver.status_code == 403
    assert (
        one_line_error(not_approver) == "bob is not an approver of team film (its approvers: ana)"
    )
    assert unknown.status_code == 404 and one_line_error(unknown) == "job no-such-job not found"
    assert no_act.status_code == 404
    assert refused_so_far == ["awaiting_approval"] * 3  # nothing refused reached a job

    assert approved.status_code == 200, approved.text
    shown = approved.json()
    assert set(shown) >= {"job_id", "state", "route", "approval", "progress", "cloud", "error"}
    assert shown["approval"] is not None, json.dumps(shown)
    assert shown["approval"]["by"] == "ana" and shown["approval"]["reason"] == "client deadline"
    assert shown["state"] in ("running_cloud", "completed")
    assert again.status_code == 409 and "is not awaiting approval" in one_line_error(again)
    assert (done.state, done.route) == ("completed", "cloud")
    assert stubs.calls[MINIMAX_CREATE] == 1

    assert rejected.status_code == 200, rejected.text
    assert rejected.json()["approval"]["approved"] is False
    assert rejected.json()["approval"]["by"] == "bob"

    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["state"] == "cancelled"
    assert cancelled.json()["cancelled_by"]["by"] == "bob"
    assert cancelled_again.status_code == 409 and "already ended" in one_line_error(cancelled_again)


async def test_a_closed_console_asks_readers_to_sign_in(run_dev_jobs: RunJobs, tmp_path: Path):
    async with run_dev_jobs(RouteStubs(FREE)) as jobs:
        app, people = console_app(
            jobs.client, jobs.task_queue, tmp_path / "secrets", open_read=False
        )
        token = people.add("ana")
        async with asgi_client(app) as http:
            anonymous = await http.get("/api/queue")
            page = await http.get("/")
            with_token = await http.get("/api/queue", headers={"Authorization": f"Bearer {token}"})
            health = await http.get("/healthz")
    assert anonymous.status_code == 401 and one_line_error(anonymous)
    assert page.status_code == 303 and page.headers["location"] == "/signin"
    assert with_token.status_code == 200
    assert health.status_code == 200


def test_the_console_command_has_help_and_binds_this_machine_by_default():
    from spillway.cli.parser import build_parser

    args = build_parser().parse_args(["console"])
    assert (args.host, args.port, args.run) == ("127.0.0.1", 8240, commands.cmd_console)


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost"])
def test_reading_is_open_on_this_machine_only_unless_the_setting_says(host):
    from spillway.console.serve import open_read
    from tests.support.settings import make_settings

    assert open_read(make_settings(), host)
    assert not open_read(make_settings(), "0.0.0.0")
    assert open_read(make_settings(SPILLWAY_CONSOLE_OPEN_READ=True), "0.0.0.0")
    assert not open_read(make_settings(SPILLWAY_CONSOLE_OPEN_READ=False), host)


def form_csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html
    return found.group(1)


async def test_the_page_signs_in_into_a_cookie_and_its_acts_need_the_csrf_token(
    run_dev_jobs: RunJobs, tmp_path: Path
):
    async with run_dev_jobs(RouteStubs(FREE)) as jobs:
        job_id = await jobs.submit(prompt=None)
        await jobs.until(job_id, "completed")
        app, people = console_app(jobs.client, jobs.task_queue, tmp_path / "secrets")
        token = people.add("ana")
        async with asgi_client(app) as http:
            form = await http.get("/signin")
            csrf = form_csrf(form.text)
            wrong = await http.post("/signin", data={"csrf": csrf, "token": token + "x"})
            stale = await http.post("/signin", data={"csrf": "forged", "token": token})
            form = await http.get("/signin")
            signed = await http.post("/signin", data={"csrf": form_csrf(form.text), "token": token})
            page = await http.get("/")
            session_csrf = re.search(r'data-csrf="([^"]+)"', page.text)
            assert session_csrf, page.text
            cancel = f"/api/jobs/{job_id}/cancel"
            no_csrf = await http.post(cancel)
            with_csrf = await http.post(cancel, headers={"X-CSRF-Token": session_csrf.group(1)})
            people.remove("ana")
            removed = await http.post(cancel, headers={"X-CSRF-Token": session_csrf.group(1)})

    assert wrong.status_code == 401 and "not a console user" in wrong.text
    assert stale.status_code == 403
    assert signed.status_code == 303 and signed.headers["location"] == "/"
    cookie = signed.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    assert token not in signed.headers["set-cookie"]
    assert "signed in as" in page.text and ">ana<" in page.text
    assert no_csrf.status_code == 403 and "CSRF" in one_line_error(no_csrf)
    assert with_csrf.status_code == 409 and "has already ended" in one_line_error(with_csrf)
    assert removed.status_code == 401


async def test_spillway_console_serves_on_this_machine_and_stops_on_ctrl_c(
    run_dev_jobs: RunJobs, tmp_path: Path, cli_env, dev_env, http: httpx.AsyncClient
):
    [port] = free_ports(1)
    secrets = tmp_path / "secrets"
    async with run_dev_jobs(RouteStubs(FREE)) as jobs:
        env = cli_env(
            TEMPORAL_ADDRESS=dev_env.client.service_client.config.target_host,
            SPILLWAY_TASK_QUEUE=jobs.task_queue,
            SPILLWAY_SECRETS_DIR=str(secrets),
        )
        code, token, err = await spillway("console", "user", "add", "ana", env=env)
        assert code == 0, err
        console = await asyncio.create_subprocess_exec(
            SPILLWAY, "console", "--port", str(port), env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            base = f"http://127.0.0.1:{port}"

            async def healthz() -> int:
                try:
                    status: int = (await http.get(f"{base}/healthz")).status_code
                    return status
                except httpx.TransportError:
                    assert console.returncode is None, "spillway console exited"
                    return 0

            await until(healthz, lambda status: status == 200, timeout_s=120, what="the console")
            queue = await http.get(f"{base}/api/queue")
            refused = await http.post(f"{base}/api/jobs/none/cancel")
            acted = await http.post(
                f"{base}/api/jobs/none/cancel", headers={"Authorization": f"Bearer {token.strip()}"}
            )
        finally:
            console.send_signal(signal.SIGINT)
            async with asyncio.timeout(60):
                _, stderr = await console.communicate()
    assert queue.status_code == 200 and set(queue.json()) >= {"hosts", "line"}
    assert refused.status_code == 401
    assert acted.status_code == 404 and acted.json() == {"error": "job none not found"}
    banner = stderr.decode()
    assert f"spillway console on http://127.0.0.1:{port}/ (reading open" in banner
    assert "Traceback" not in banner
    assert token.strip() not in banner


async def test_a_person_moves_a_job_in_line_and_drains_and_resumes_a_host(
    run_dev_jobs: RunJobs, tmp_path: Path
):
    stubs = RouteStubs(FREE)
    stubs.wait_release.clear()  # the first job keeps its render, and the one place, until released
    async with run_dev_jobs(stubs, A40_MAX_JOBS=1) as jobs:
        holder = await jobs.submit(prompt=None)
        await jobs.until(holder, "running_local")
        waiting = await jobs.submit(prompt=None)
        await jobs.until(waiting, "queued")
        app, people = console_app(jobs.client, jobs.task_queue, tmp_path / "secrets")
        as_ana = {"Authorization": f"Bearer {people.add('ana')}"}
        async with asgi_client(app) as http:
            moved = await http.post(
                f"/api/jobs/{waiting}/priority", headers=as_ana, json={"priority": 1, "reason": "x"}
            )
            no_number = await http.post(f"/api/jobs/{waiting}/priority", headers=as_ana)
            out_of_range = await http.post(
                f"/api/jobs/{waiting}/priority", headers=as_ana, json={"priority": 9}
            )
            running = await http.post(
                f"/api/jobs/{holder}/priority", headers=as_ana, json={"priority": 1}
            )
            anonymous = await http.post("/api/hosts/a40_local/drain")
            drained = await http.post(
                "/api/hosts/a40_local/drain", headers=as_ana, json={"reason": "new driver"}
            )
            queue = (await http.get("/api/queue")).json()
            resumed = await http.post("/api/hosts/a40_local/resume", headers=as_ana)
            unknown = await http.post("/api/hosts/nowhere/drain", headers=as_ana)
        stubs.wait_release.set()
        await jobs.finished(holder)
        await jobs.finished(waiting)

    assert moved.status_code == 200, moved.text
    assert moved.json()["priority_changes"][-1]["by"] == "ana"
    assert moved.json()["priority_changes"][-1]["priority"] == 1
    assert no_number.status_code == 400 and "priority" in one_line_error(no_number)
    assert out_of_range.status_code == 400
    assert running.status_code == 409 and one_line_error(running)
    assert anonymous.status_code == 401
    assert drained.status_code == 200, drained.text
    assert drained.json()["drained"]["by"] == "ana"
    assert drained.json()["drained"]["reason"] == "new driver"
    assert queue["hosts"][0]["drained"]["by"] == "ana"
    assert resumed.status_code == 200 and resumed.json()["drained"] is None
    assert unknown.status_code == 404 and "no GPU host 'nowhere'" in one_line_error(unknown)
