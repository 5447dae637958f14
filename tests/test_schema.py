"""The published contract (docs/schema/, docs/design.md "Clients, inputs and outputs"): the
committed JSON Schemas are exactly what `spillway schema` prints (the CI check), and they accept
what the workflow accepts and refuse what it refuses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from spillway.core.models import ApprovalDecision, Plan, VideoJob
from spillway.core.settings import PROJECT_ROOT
from spillway.schema import SCHEMA_NAMES, schema_text, schemas
from tests.support.cli import spillway
from tests.support.graphs import VIDEO_GRAPH
from tests.support.images import I2V_GRAPH

COMMITTED = PROJECT_ROOT / "docs" / "schema"
REGENERATE = "run `spillway schema --write docs/schema` and commit docs/schema/"


@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_the_committed_schema_is_what_spillway_schema_prints(name: str):
    path = COMMITTED / f"{name}.json"
    assert path.is_file(), f"{path} is missing: {REGENERATE}"
    assert path.read_text(encoding="utf-8") == schema_text(name), (
        f"docs/schema/{name}.json is not what `spillway schema {name}` prints now "
        f"(a model changed): {REGENERATE}"
    )


def test_every_schema_is_committed():
    assert sorted(p.stem for p in COMMITTED.glob("*.json")) == sorted(SCHEMA_NAMES)


async def test_schema_write_writes_the_committed_files(cli_env, tmp_path: Path):
    code, out, err = await spillway("schema", "--write", str(tmp_path / "out"), env=cli_env())
    assert code == 0, err
    assert out.count("wrote ") == len(SCHEMA_NAMES)
    for name in SCHEMA_NAMES:
        written = (tmp_path / "out" / f"{name}.json").read_text(encoding="utf-8")
        assert written == (COMMITTED / f"{name}.json").read_text(encoding="utf-8")
    code, out, _ = await spillway("schema", env=cli_env())
    assert code == 0 and set(json.loads(out)) == set(SCHEMA_NAMES)


def _validator(name: str) -> Any:
    schema = json.loads((COMMITTED / f"{name}.json").read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_job_schema_leaves_out_carry_which_only_continue_as_new_sets():
    job = schemas()["video-job"]
    assert "carry" not in job["properties"]
    assert not {"AwaitCarry", "Policy", "Plan"} & set(job.get("$defs", {}))


GOOD_JOBS: list[dict[str, Any]] = [
    {"job_id": "job-1", "graph": VIDEO_GRAPH},
    {
        "job_id": "job.2_b",
        "graph": I2V_GRAPH,
        "cloud": {"prompt": "a heron", "duration": 10, "resolution": "768P"},
        "inputs": [{"node": "1", "uri": "s3://b/in/x.png", "sha256": "a" * 64}],
        "callback_url": "https://example.com/hooks/spillway",
        "priority": 1,
    },
    {"job_id": "job-3", "graph": VIDEO_GRAPH, "team": "ads"},
]
BAD_JOBS: list[dict[str, Any]] = [
    {"job_id": "job-1", "graph": 5},
    {"graph": VIDEO_GRAPH},
    {"job_id": "job-1", "graph": {"1": {"inputs": {}}}},
    {"job_id": "job-1", "graph": {}},
    {"job_id": "a b", "graph": VIDEO_GRAPH},
    {"job_id": "job-1", "graph": VIDEO_GRAPH, "priority": 9},
    {"job_id": "job-1", "graph": VIDEO_GRAPH, "callback_url": "ftp://example.com/x"},
    {"job_id": "job-1", "graph": VIDEO_GRAPH, "team": "ads team"},
]


@pytest.mark.parametrize("payload", GOOD_JOBS)
def test_a_job_the_workflow_accepts_meets_the_schema(payload: dict[str, Any]):
    VideoJob.model_validate(payload)
    _validator("video-job").validate(payload)


def test_a_job_without_a_team_stays_valid_input():
    """Clients written before teams send no `team`: their jobs are the default team's."""
    assert "team" not in schemas()["video-job"].get("required", [])
    _validator("video-job").validate({"job_id": "job-1", "graph": VIDEO_GRAPH})
    assert VideoJob.model_validate({"job_id": "job-1", "graph": VIDEO_GRAPH}).team is None


@pytest.mark.parametrize("payload", BAD_JOBS)
def test_a_job_the_workflow_refuses_fails_the_schema_too(payload: dict[str, Any]):
    with pytest.raises(ValueError):
        VideoJob.model_validate(payload)
    assert not _validator("video-job").is_valid(payload)


def test_the_ui_signal_json_and_a_plan_meet_their_schemas():
    ui_signal = {"approved": False, "by": "ui-user", "reason": "too expensive"}
    ApprovalDecision.model_validate(ui_signal)
    _validator("approval").validate(ui_signal)
    assert not _validator("approval").is_valid({"approved": True})
    plan = Plan(job_id="job-1", state="completed", route="local")
    _validator("plan").validate(json.loads(plan.model_dump_json()))
