"""The approval webhook: a failure names the status code, never the URL (a Slack or Mattermost
webhook URL is a credential, and an activity failure lands in history, the UI and the log)."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.notify import NotifyActivities
from spillway.core.models import ApprovalNotice
from spillway.core.settings import Settings
from tests.support.route_stubs import BUSY

SECRET_PATH = "/services/T000/B000/XXXX-secret-webhook-token"


def notice() -> ApprovalNotice:
    return ApprovalNotice(
        text="job waits",
        job_id="job-1",
        trigger="overloaded",
        reasons=BUSY.reasons,
        last_signal=BUSY,
        approve_command="spillway approve job-1 --by NAME --reason TEXT",
        reject_command="spillway reject job-1 --by NAME --reason TEXT",
        ui_link="http://ui/namespaces/default/workflows/job-1",
        decide_by=BUSY.measured_at,
    )


@pytest.fixture
async def receiver() -> Any:
    received: list[Any] = []
    answer = {"status": 200}  # what the hook answers; a test may change it

    async def hook(request: web.Request) -> web.Response:
        received.append(await request.json())
        return web.Response(status=answer["status"])

    app = web.Application()
    app.router.add_post(SECRET_PATH, hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield answer, f"http://127.0.0.1:{port}{SECRET_PATH}", received
    await runner.cleanup()


async def test_the_notice_reaches_the_webhook(http, receiver):
    _, url, received = receiver
    acts = NotifyActivities(http, Settings(APPROVAL_WEBHOOK_URL=url))
    await ActivityEnvironment().run(acts.notify_approval_needed, notice())
    assert received[0]["job_id"] == "job-1" and received[0]["text"] == "job waits"


async def test_a_failing_webhook_names_the_status_code_never_the_url(http, receiver):
    answer, url, _ = receiver
    answer["status"] = 500
    acts = NotifyActivities(http, Settings(APPROVAL_WEBHOOK_URL=url))
    with pytest.raises(ApplicationError) as failed:
        await ActivityEnvironment().run(acts.notify_approval_needed, notice())
    assert "HTTP 500" in failed.value.message
    assert "secret-webhook-token" not in str(failed.value) and "127.0.0.1" not in str(failed.value)


async def test_an_unreachable_webhook_never_names_the_url(http, refused_url):
    acts = NotifyActivities(http, Settings(APPROVAL_WEBHOOK_URL=refused_url + SECRET_PATH))
    with pytest.raises(ApplicationError) as failed:
        await ActivityEnvironment().run(acts.notify_approval_needed, notice())
    assert "could not be reached (ConnectError)" in failed.value.message
    assert "secret-webhook-token" not in str(failed.value)
