"""What every cloud provider's create answer proves, in one shape (money invariant 2).

Each provider has a pure function that reads its answer into a `CreateVerdict`; the activity acts
on the verdict alone, so the money-deciding step is table-tested per provider.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel

CreateOutcome = Literal["created", "retry", "refused", "ambiguous"]


class CreateVerdict(BaseModel):
    """- `created`: a task exists (`task_id`); record it at once.
    - `retry`: the provider provably made nothing and says "later" (rate, volume): send again
      after a backoff (`rate_limited` asks for a longer one).
    - `refused`: the provider provably made nothing and will not for this request or account
      (auth, balance, quota, parameters): the next provider may take the job.
    - `ambiguous`: a task, and a charge, may exist. Never send the same create again unless the
      provider can be asked whether the task exists (an idempotency key).
    """

    outcome: CreateOutcome
    task_id: str | None = None
    code: int | None = None
    message: str = ""  # the provider's own words, never a key
    rate_limited: bool = False
    sent_at: datetime | None = None  # when the (last) request left: the time to look for
    attempts: int = 1  # requests sent; all but the last were provably refused
