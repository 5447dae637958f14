"""How a prompt of the ComfyUI double ends in execution_error (spillway/sim/comfyui_run.py runs
it; `fail_next()` / `fail_prompt()` of spillway/sim/comfyui.py choose it)."""

from __future__ import annotations

from dataclasses import dataclass

# The runtime failure recorded in history_execution_error.json.
DEFAULT_EXCEPTION = (
    "av.error.ExternalError",
    "[Errno 542398533] Generic error in an external library: 'avcodec_open2(\"libx264\", {})'\n",
)


@dataclass(frozen=True)
class Failure:
    """How a prompt ends in execution_error: at `node_id` (default: its last node)."""

    message: str = DEFAULT_EXCEPTION[1]
    exception_type: str = DEFAULT_EXCEPTION[0]
    node_id: str | None = None
