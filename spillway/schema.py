"""The published contract, committed as docs/schema/*.json: the JSON Schemas a client in any
language needs to start `VideoJobWorkflow` itself (workflow id = job id, task queue
SPILLWAY_TASK_QUEUE), decide an approval and read a plan (docs/clients.md, "Starting jobs from
code").
`spillway schema [NAME] [--write DIR]` prints or writes them; tests/test_schema.py checks the
committed files are current."""

from __future__ import annotations

import json
from typing import Any

from spillway.core.gpu_pool import PoolView
from spillway.core.models import ApprovalDecision, Plan, Quote, VideoJob

SCHEMA_NAMES = ("video-job", "approval", "plan", "queue", "quote")
JSON_SCHEMA = "https://json-schema.org/draft/2020-12/schema"


def schemas() -> dict[str, dict[str, Any]]:
    """The JSON Schemas of a job's input (VideoJob, without `carry`, which only the workflow's
    continue-as-new sets), of an approval (the `approval` signal and `decide_approval` update)
    and of a plan (`status --json`, the workflow's result, the `plan` query), of the GPU
    line (`spillway queue --json`, the GPU pool's `view` query) and of a quote (`spillway quote
    --json`, SpillwayQuoteWorkflow's result)."""
    job = VideoJob.model_json_schema(mode="validation")
    del job["properties"]["carry"]
    # What the workflow checks of a graph (spillway.core.models._check_graph), for other languages.
    job["properties"]["graph"] = {
        "description": "an API-format ComfyUI graph (ComfyUI: Export (API)): node id -> node",
        "type": "object",
        "minProperties": 1,
        "additionalProperties": {
            "type": "object",
            "properties": {
                "class_type": {"type": "string", "minLength": 1},
                "inputs": {"type": "object"},
            },
            "required": ["class_type"],
        },
    }
    job["description"] = (
        "Input of the Temporal workflow VideoJobWorkflow: start it with workflow id = job_id on "
        "the task queue SPILLWAY_TASK_QUEUE. Input that fails validation ends the workflow "
        "failed at once, naming each bad field."
    )
    found = {
        "video-job": job,
        "approval": ApprovalDecision.model_json_schema(mode="validation"),
        "plan": Plan.model_json_schema(mode="serialization"),
        "queue": PoolView.model_json_schema(mode="serialization"),
        "quote": Quote.model_json_schema(mode="serialization"),
    }
    return {name: {"$schema": JSON_SCHEMA, **_only_used_defs(s)} for name, s in found.items()}


def schema_text(name: str) -> str:
    """One schema as committed under docs/schema/<name>.json."""
    return json.dumps(schemas()[name], indent=2, ensure_ascii=False) + "\n"


def _only_used_defs(schema: dict[str, Any]) -> dict[str, Any]:
    defs: dict[str, Any] = schema.pop("$defs", {})
    used: set[str] = set()
    todo: list[Any] = [schema]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                name = ref.removeprefix("#/$defs/")
                if name not in used:
                    used.add(name)
                    todo.append(defs[name])
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    kept = {name: value for name, value in defs.items() if name in used}
    return schema | ({"$defs": kept} if kept else {})
