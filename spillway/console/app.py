"""The console's web application (docs/console.md): the page, its sign-in and the JSON API.

It reads and acts only through spillway.client, the API the CLI uses: the same queries, lists,
updates and signals, with the signed-in person as `--by`. Every answer it makes itself is JSON of
one line or the page; an error is `{"error": "..."}` with a 4xx (5xx only when Temporal or a
worker does not answer), never a traceback."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal, cast
from urllib.parse import parse_qs, quote

from jinja2 import Environment, PackageLoader, select_autoescape
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from spillway.client import SpillwayClient
from spillway.client import jobs as job_ops
from spillway.client.budget import ledger_summary
from spillway.client.hosts import set_drain
from spillway.client.new_jobs import make_decision
from spillway.client.queue import pool_view
from spillway.client.teams import team_list
from spillway.console.people import People
from spillway.console.sessions import PRE_COOKIE, SESSION_COOKIE, Session, Signer, same
from spillway.core.errors import ConfigError, Failed, JobNotFound
from spillway.core.gpu_pool import PoolDrain
from spillway.core.ledger import LedgerSummary
from spillway.core.models import FINAL_STATES, Plan, plan_json
from spillway.core.settings import describe_validation_error
from spillway.core.teams import load_teams

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024  # an act's body is a reason of 1,000 characters at most
RECENT = 20  # jobs in the page's "recent" list
# An act answers once the job's plan shows it, or after this (with the plan as it is then): a
# render stops at its next node boundary, and no worker may be running.
SHOWN_WITHIN_S = 15.0
Act = Literal["approve", "reject", "cancel", "priority"]
ACTS = ("approve", "reject", "cancel", "priority")


class ActBody(BaseModel):
    """`POST /api/jobs/<id>/approve|reject|cancel|priority`'s and `POST /api/hosts/<name>/
    drain|resume`'s optional JSON body; `priority` (1 first .. 5) only for priority."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field("", max_length=1000)
    priority: int | None = Field(None, ge=1, le=5)


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def error(status: int, message: str) -> JSONResponse:
    # One line: a message from Temporal may hold newlines, a script reads the line.
    return JSONResponse({"error": " ".join(message.split())}, status_code=status)


@dataclass
class Console:
    client: SpillwayClient
    people: People
    signer: Signer
    open_read: bool
    ui_url: str

    def session(self, request: Request) -> Session | None:
        found = self.signer.session(request.cookies.get(SESSION_COOKIE))
        # A person removed since they signed in is signed out at once.
        if found is None or not self.people.has(found.name):
            return None
        return found

    def bearer(self, request: Request) -> str | None:
        """The person a bearer token names; None without the header; ApiError 401 for a token
        that names nobody."""
        header = request.headers.get("authorization")
        if header is None:
            return None
        scheme, _, token = header.partition(" ")
        name = self.people.who(token.strip()) if scheme.lower() == "bearer" else None
        if name is None:
            raise ApiError(
                401, "the bearer token is not a console user's (spillway console user add)"
            )
        return name

    def reader(self, request: Request) -> None:
        if self.open_read:
            return
        if self.bearer(request) is None and self.session(request) is None:
            raise ApiError(401, "sign in to read the console (or send Authorization: Bearer TOKEN)")

    def actor(self, request: Request) -> str:
        """Who acts: a bearer token's person, or the signed-in person of a request that carries
        their session's CSRF token (a form of the page; a cross-site post cannot know it)."""
        name = self.bearer(request)
        if name is not None:
            return name
        session = self.session(request)
        if session is None:
            raise ApiError(401, "acting needs a signed-in person: send Authorization: Bearer TOKEN")
        if not same(request.headers.get("x-csrf-token"), session.csrf):
            raise ApiError(403, "the form's CSRF token is missing or not this session's: reload")
        return session.name

    def job_link(self, job_id: str) -> str:
        namespace = quote(self.client.temporal.namespace, safe="")
        return f"{self.ui_url}/namespaces/{namespace}/workflows/{quote(job_id, safe='')}"

    async def queue(self) -> dict[str, Any]:
        view = await pool_view(self.client.temporal, self.client.task_queue)
        return cast(dict[str, Any], json.loads(view.model_dump_json()))

    async def status(self, job_id: str) -> dict[str, Any]:
        plan = await self.client.status(job_id)
        return cast(dict[str, Any], json.loads(plan_json(plan)))

    async def teams(self) -> list[dict[str, Any]]:
        settings = self.client.settings.model_copy(
            update={"SPILLWAY_TASK_QUEUE": self.client.task_queue}
        )
        rows = await team_list(self.client.temporal, settings)
        return [r.model_dump(mode="json") for r in rows]

    async def board(self) -> dict[str, Any]:
        """What the page shows beside the queue: the renders with their progress, the jobs
        awaiting approval with their quote, recent jobs and the cloud spend per day and team.
        A part that cannot be read (no worker for the ledger) is null with why."""
        recent, awaiting, renders, spend = await asyncio.gather(
            self._recent(), self._awaiting(), self._renders(), self._spend(), return_exceptions=True
        )
        return {
            "recent": _part(recent),
            "awaiting": _part(awaiting),
            "renders": _part(renders),
            "spend": _part(spend),
            "problems": [
                " ".join(str(p).split())
                for p in (recent, awaiting, renders, spend)
                if isinstance(p, Exception)
            ],
        }

    async def _recent(self) -> list[dict[str, Any]]:
        # The page's pool and line are its task queue's, and so are its recent jobs and those
        # awaiting approval: another spillway may share the namespace.
        found = await self.client.list(limit=RECENT, task_queue=self.client.task_queue)
        return [j.model_dump(mode="json") | {"link": self.job_link(j.job_id)} for j in found]

    async def _awaiting(self) -> list[dict[str, Any]]:
        queue = self.client.task_queue
        found = await self.client.list("awaiting_approval", limit=50, task_queue=queue)
        plans = await asyncio.gather(
            *(self.client.status(j.job_id) for j in found), return_exceptions=True
        )
        return [
            _awaiting_row(plan) | {"link": self.job_link(plan.job_id)}
            for plan in plans
            if isinstance(plan, Plan) and plan.state == "awaiting_approval"
        ]

    async def _renders(self) -> list[dict[str, Any]]:
        view = await pool_view(self.client.temporal, self.client.task_queue)
        held = [(h.name, p.job_id) for h in view.hosts for p in h.places if p.clearing is None]
        plans = await asyncio.gather(
            *(self.client.status(job_id) for _, job_id in held), return_exceptions=True
        )
        rows = []
        for (host, job_id), plan in zip(held, plans, strict=True):
            if not isinstance(plan, Plan) or plan.state in FINAL_STATES:
                continue
            progress = plan.progress
            rows.append(
                {
                    "job_id": job_id,
                    "host": host,
                    "state": plan.state,
                    "team": plan.team,
                    "progress": None if progress is None else progress.model_dump(mode="json"),
                    "brief": None if progress is None else progress.brief(),
                    "link": self.job_link(job_id),
                }
            )
        return rows

    async def _spend(self) -> dict[str, Any]:
        settings = self.client.settings.model_copy(
            update={"SPILLWAY_TASK_QUEUE": self.client.task_queue}
        )
        return spend_by_day_and_team(await ledger_summary(self.client.temporal, settings))

    async def act(self, act: Act, job_id: str, by: str, body: ActBody) -> dict[str, Any]:
        reason = body.reason
        if act == "priority":
            if body.priority is None:
                raise ApiError(400, 'priority needs {"priority": N}, 1 (first) .. 5')
            await self.client.set_priority(job_id, body.priority, by, reason, on_note=log.warning)
            return await self.status(job_id)
        current = await self.client.status(job_id)
        if act == "cancel":
            if current.state in FINAL_STATES:
                raise ApiError(409, f"job {job_id} has already ended ({current.state})")
            await self._cancel(job_id, by, reason)
            return await self.status(job_id)
        if current.state != "awaiting_approval":
            raise ApiError(409, f"job {job_id} is not awaiting approval (state: {current.state})")
        if act == "approve":
            self._may_approve(current, by)
        decision = make_decision(act == "approve", by, reason)
        await self.client.decide(job_id, decision)
        # The job answers the update before its next publication of the plan: the answer waits
        # for the plan that shows the decision, so a script reads what it did.
        await self._shown(job_id, lambda plan: plan.state != "awaiting_approval")
        return await self.status(job_id)

    async def host(self, name: str, drain: bool, by: str, reason: str) -> dict[str, Any]:
        """`spillway host drain|resume NAME --by`: the host as the pool shows it after."""
        try:
            order = PoolDrain(host=name, drain=drain, by=by, reason=reason)
        except ValidationError as exc:
            raise ConfigError(describe_validation_error(exc, "drain")) from None
        try:
            host = await set_drain(self.client.temporal, self.client.task_queue, order)
        except ConfigError as exc:
            if str(exc).startswith("no GPU host"):
                raise ApiError(404, str(exc)) from None
            raise
        return host.model_dump(mode="json")

    def _may_approve(self, plan: Plan, by: str) -> None:
        """The teams file's `approvers` as the workflow applies them (workflows/approval.py):
        refused here first, so a person the team does not list gets a 403, not a job refusal."""
        teams = load_teams(self.client.settings.SPILLWAY_TEAMS_FILE)
        team = plan.team or teams.default
        held = teams.teams.get(team)
        approvers = None if held is None else held.approvers
        if approvers is not None and by not in approvers:
            listed = ", ".join(approvers) or "nobody"
            raise ApiError(403, f"{by} is not an approver of team {team} (its approvers: {listed})")

    async def _cancel(self, job_id: str, by: str, reason: str) -> None:
        """The cancel as `spillway cancel` sends it (who and why, then the request)."""
        from spillway.core.models import CancelNote

        try:
            note = CancelNote(by=by, reason=reason)
        except ValidationError as exc:
            raise ConfigError(describe_validation_error(exc, "cancel")) from None
        await job_ops.cancel(self.client.temporal, job_id, note)
        await self._shown(job_id, lambda plan: plan.state in FINAL_STATES)

    async def _shown(self, job_id: str, done: Callable[[Plan], bool]) -> None:
        until = time.monotonic() + SHOWN_WITHIN_S
        while time.monotonic() < until:
            if done(await self.client.status(job_id)):
                return
            await asyncio.sleep(0.2)


def _part(found: object) -> object:
    return None if isinstance(found, BaseException) else found


def _awaiting_row(plan: Plan) -> dict[str, Any]:
    budget = plan.budget
    return {
        "job_id": plan.job_id,
        "team": plan.team,
        "reasons": plan.reasons,
        "trigger": plan.overflow.trigger if plan.overflow else None,
        "estimate_usd": None if budget is None else budget.estimate_usd,
        "provider": None if budget is None else budget.provider,
        "day_remaining_usd": None if budget is None else budget.day_remaining_usd,
    }


def spend_by_day_and_team(summary: LedgerSummary) -> dict[str, Any]:
    """This month's creates that cost or may cost money, summed per UTC day and team (the
    ledger keeps the month's entries); a create reserved and not settled counts, as the budget
    counts it."""
    days: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for entry in summary.entries:
        if entry.state in ("released", "refused") or entry.cost_usd is None:
            continue
        days[f"{entry.at:%Y-%m-%d}"][entry.team or "studio"] += entry.cost_usd
    teams = sorted({t for per in days.values() for t in per})
    return {
        "teams": teams,
        "days": [
            {"day": day, "by_team": {t: round(v, 4) for t, v in per.items()}}
            for day, per in sorted(days.items())
        ],
        "today_spent_usd": summary.day.spent_usd + summary.day.reserved_usd,
        "day_budget_usd": summary.day.budget_usd,
    }


Handler = Callable[[Request], Awaitable[Response]]


def api(handler: Handler) -> Handler:
    """Every API route: its errors as one line of JSON with their status."""

    async def guarded(request: Request) -> Response:
        try:
            return await handler(request)
        except ApiError as exc:
            return error(exc.status, exc.message)
        except JobNotFound as exc:
            return error(404, str(exc))
        except ConfigError as exc:
            return error(400, str(exc))
        except Failed as exc:
            # A refusal of an act is a conflict with the job's state; a read that failed is
            # Temporal or a worker not answering.
            return error(409 if request.method == "POST" else 503, str(exc))

    return guarded


async def read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_BODY):
        raise ApiError(413, f"the body is over {MAX_BODY // 1024} KB")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            raise ApiError(413, f"the body is over {MAX_BODY // 1024} KB")
    return body


def act_body(body: bytes) -> ActBody:
    if not body.strip():
        return ActBody()
    try:
        return ActBody.model_validate_json(body)
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            raise ApiError(400, 'the body is not JSON: send {"reason": "..."} or nothing') from None
        raise ApiError(400, describe_validation_error(exc, "body")) from None


def _field(fields: dict[str, list[str]], name: str) -> str | None:
    values = fields.get(name)
    return values[0] if values else None


def create_app(console: Console) -> Starlette:
    templates = Environment(
        loader=PackageLoader("spillway.console", "templates"),
        autoescape=select_autoescape(("html",)),
    )

    def page(name: str, status: int = 200, **values: Any) -> HTMLResponse:
        response = HTMLResponse(templates.get_template(name).render(**values), status_code=status)
        response.headers["content-security-policy"] = (
            "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
            "frame-ancestors 'none'; form-action 'self'"
        )
        response.headers["x-content-type-options"] = "nosniff"
        return response

    async def index(request: Request) -> Response:
        session = console.session(request)
        if session is None and not console.open_read:
            return RedirectResponse("/signin", status_code=303)
        return page("index.html", session=session, ui_url=console.ui_url)

    async def signin_form(request: Request, status: int = 200, problem: str = "") -> Response:
        pre = console.signer.seal({"signin": True, "n": time.time_ns()})
        response = page("signin.html", status=status, csrf=pre, problem=problem)
        response.set_cookie(PRE_COOKIE, pre, httponly=True, samesite="strict", max_age=3600)
        return response

    async def signin_get(request: Request) -> Response:
        return await signin_form(request)

    async def signin_post(request: Request) -> Response:
        try:
            body = await read_body(request)
        except ApiError as exc:
            return error(exc.status, exc.message)
        fields = parse_qs(body.decode("utf-8", "replace"))
        csrf = _field(fields, "csrf")
        if not same(csrf, request.cookies.get(PRE_COOKIE)):
            return await signin_form(request, 403, "the form was stale: sign in again")
        token = (_field(fields, "token") or "").strip()
        name = console.people.who(token)
        if name is None:
            return await signin_form(request, 401, "that token is not a console user's")
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(
            SESSION_COOKIE,
            console.signer.session_cookie(name),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        response.delete_cookie(PRE_COOKIE)
        return response

    async def signout(request: Request) -> Response:
        body = await read_body(request)
        session = console.session(request)
        csrf = _field(parse_qs(body.decode("utf-8", "replace")), "csrf")
        response = RedirectResponse("/", status_code=303)
        if session is not None and same(csrf, session.csrf):
            response.delete_cookie(SESSION_COOKIE)
        return response

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True})

    @api
    async def api_queue(request: Request) -> Response:
        console.reader(request)
        return JSONResponse(await console.queue())

    @api
    async def api_teams(request: Request) -> Response:
        console.reader(request)
        return JSONResponse(await console.teams())

    @api
    async def api_board(request: Request) -> Response:
        console.reader(request)
        return JSONResponse(await console.board())

    @api
    async def api_job(request: Request) -> Response:
        console.reader(request)
        return JSONResponse(await console.status(request.path_params["job_id"]))

    @api
    async def api_act(request: Request) -> Response:
        act = request.path_params["act"]
        if act not in ACTS:
            raise ApiError(404, f"no such act {act!r}: {', '.join(ACTS)}")
        by = console.actor(request)
        body = act_body(await read_body(request))
        job_id = request.path_params["job_id"]
        log.info("console: %s %s by %s", act, job_id, by)
        return JSONResponse(await console.act(cast(Act, act), job_id, by, body))

    @api
    async def api_host(request: Request) -> Response:
        act = request.path_params["act"]
        if act not in ("drain", "resume"):
            raise ApiError(404, f"no such act {act!r}: drain or resume")
        by = console.actor(request)
        body = act_body(await read_body(request))
        name = request.path_params["name"]
        log.info("console: %s host %s by %s", act, name, by)
        return JSONResponse(await console.host(name, act == "drain", by, body.reason))

    async def not_found(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 404
        if status == 405:
            return error(405, f"{request.method} is not allowed on {request.url.path}")
        return error(status, f"no such page or API route: {request.url.path}")

    async def server_error(request: Request, exc: Exception) -> Response:
        log.exception("console: %s %s failed", request.method, request.url.path)
        return error(500, f"the console failed: {type(exc).__name__} (see its log)")

    static = resources.files("spillway.console") / "static"
    routes = [
        Route("/", index),
        Route("/signin", signin_get, methods=["GET"]),
        Route("/signin", signin_post, methods=["POST"]),
        Route("/signout", signout, methods=["POST"]),
        Route("/healthz", healthz),
        Route("/api/queue", api_queue),
        Route("/api/teams", api_teams),
        Route("/api/board", api_board),
        Route("/api/jobs/{job_id}", api_job),
        Route("/api/jobs/{job_id}/{act}", api_act, methods=["POST"]),
        Route("/api/hosts/{name}/{act}", api_host, methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(static)), name="static"),
    ]
    return Starlette(
        routes=routes,
        exception_handlers={HTTPException: not_found, Exception: server_error},
    )
