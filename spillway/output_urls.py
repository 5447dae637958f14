"""Presigned URLs for a plan's outputs in object storage, as `spillway status` and the job's
completion callback show them (spillway/client.py, activities/callbacks.py).

activities/storage.py (the output store) is being settled; this is the one place that knows its
API: `presign(settings, uri, expires_s) -> str | None`, raising ConfigError, ValueError or
StoreError.
"""

from __future__ import annotations

import contextlib

from spillway.errors import ConfigError
from spillway.models import OutputFile, Plan
from spillway.settings import Settings

PRESIGN_EXPIRES_S = 3600  # how long a presigned output URL from `status` lasts


async def presign_outputs(
    plan: Plan, settings: Settings, expires_s: int = PRESIGN_EXPIRES_S
) -> Plan:
    """The plan with a `url` for every output in object storage that these settings can sign
    (SPILLWAY_OUTPUT_URL and the AWS_* variables); the others keep `url` None. Signing makes
    no request to S3, and a store that cannot sign leaves the URLs out rather than failing
    `status`."""
    if not any(out.uri and out.uri.startswith("s3://") for out in plan.outputs):
        return plan
    from activities.storage import StoreError
    from activities.store_opening import presign

    outputs: list[OutputFile] = []
    for out in plan.outputs:
        url = None
        if out.uri:
            with contextlib.suppress(ConfigError, StoreError, ValueError):
                url = await presign(settings, out.uri, expires_s)
        outputs.append(out.model_copy(update={"url": url}))
    return plan.model_copy(update={"outputs": outputs})
