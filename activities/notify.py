"""`notify_approval_needed`: tells a person that a job waits for their decision.

The workflow retries it a few times and then gives up: a failing webhook never blocks or fails
the job (the Temporal UI and `spillway list --state awaiting_approval` still show it)."""

from __future__ import annotations

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from spillway.core import names
from spillway.core.models import ApprovalNotice
from spillway.core.settings import Settings


class NotifyActivities:
    def __init__(self, http: httpx.AsyncClient, settings: Settings) -> None:
        self._http, self._settings = http, settings

    @activity.defn(name=names.NOTIFY_APPROVAL)
    async def notify_approval_needed(self, notice: ApprovalNotice) -> None:
        url = self._settings.APPROVAL_WEBHOOK_URL
        if url is None:
            return
        # The URL is a credential (a Slack or Mattermost webhook): no error names it, since an
        # activity failure lands in history, the UI and the log.
        try:
            response = await self._http.post(
                str(url), json=notice.model_dump(mode="json"), timeout=10
            )
        except httpx.HTTPError as exc:
            raise ApplicationError(
                f"APPROVAL_WEBHOOK_URL could not be reached ({type(exc).__name__})",
                type="ApprovalWebhookFailed",
            ) from None
        if not response.is_success:
            raise ApplicationError(
                f"APPROVAL_WEBHOOK_URL answered HTTP {response.status_code}",
                type="ApprovalWebhookFailed",
            )
