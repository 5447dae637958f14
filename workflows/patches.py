"""The workflow's patch ids (`workflow.patched`) and the floor under them.

Every patch a new run meets costs a marker event and an upsert of `TemporalChangeVersion` (one
more event and a visibility write). A run that starts with this code records PATCH_FLOOR once,
at its first patch, and no marker for any patch under it; a history from before the floor has
no floor marker and meets each patch's own, as it was recorded. Live, both read the same: a
patch met live is always taken. A patch added after the floor gets a marker of its own, until a
later floor covers it. Workflow code only.
"""

from __future__ import annotations

# Each one: a history recorded before its change replays without it.
PATCH_LEDGER = "spend-ledger-reserve"
PATCH_BUDGET_VIEW = "spend-ledger-budget-view"
PATCH_HOSTS = "gpu-hosts"
PATCH_PROMPT_PER_RUN = "prompt-id-per-run"
PATCH_CALLBACKS = "job-callbacks"
PATCH_FOLLOW_LOST_CREATE = "follow-charged-after-lost-create"
PATCH_RECORDED_BEFORE_ASKING = "recorded-create-before-asking"
PATCH_ANSWER_AT_END = "answer-open-decision-at-end"
PATCH_POLICY_HERE = "policy-read-as-local-activity"
PATCH_CANCEL_THROUGH_READS = "cancel-not-swallowed-by-ledger-reads"
PATCH_RECONCILE_LOST_CREATE = "reconcile-lost-kling-create"

PATCH_FLOOR = "patch-floor-1"
UNDER_FLOOR = frozenset(
    {
        PATCH_LEDGER,
        PATCH_BUDGET_VIEW,
        PATCH_HOSTS,
        PATCH_PROMPT_PER_RUN,
        PATCH_CALLBACKS,
        PATCH_FOLLOW_LOST_CREATE,
        PATCH_RECORDED_BEFORE_ASKING,
        PATCH_ANSWER_AT_END,
        PATCH_POLICY_HERE,
        PATCH_CANCEL_THROUGH_READS,
        PATCH_RECONCILE_LOST_CREATE,
    }
)
