"""Every activity's registered name, in one place for the activities, the stand-ins tests use
and the tests that count calls. These names are on the wire: a running job's history schedules
them, so renaming one breaks the jobs that are running (the replay test says so)."""

from __future__ import annotations

READ_POLICY = "read_policy"
PROBE = "a40_load_status"
NOTIFY_APPROVAL = "notify_approval_needed"

COMFYUI_SUBMIT = "comfyui_submit"
COMFYUI_WAIT = "comfyui_wait"
COMFYUI_DOWNLOAD = "comfyui_download"
COMFYUI_CANCEL = "comfyui_cancel"
COMFYUI_UPLOAD = "comfyui_upload"

MINIMAX_CREATE = "minimax_create"
MINIMAX_POLL = "minimax_poll"
MINIMAX_DOWNLOAD = "minimax_download"

KLING_CREATE = "kling_create"
KLING_POLL = "kling_poll"
KLING_DOWNLOAD = "kling_download"
KLING_RECONCILE = "kling_reconcile"

SPEND_RESERVE = "spend_reserve"
SPEND_SETTLE = "spend_settle"
SPEND_VIEW = "spend_view"
SPEND_RECORDED = "spend_recorded"

JOB_CALLBACK = "job_callback"
