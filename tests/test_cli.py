"""The `spillway` console script as people and scripts use it: exit codes, one-line errors,
JSON shapes (docs/design.md, "The command-line contract")."""

from __future__ import annotations

import argparse
import json
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from google.protobuf.duration_pb2 import Duration
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest
from temporalio.testing import WorkflowEnvironment

from spillway.cli.parser import build_parser
from spillway.cli.render import render_queue
from spillway.core import search_attributes
from spillway.core.gpu_pool import HostPlaces, InLine, PoolView
from tests.support.cli import free_ports, one_line, spillway, spillway_process
from tests.support.constants import FREE_VRAM_PCT
from tests.support.graphs import VIDEO_GRAPH

LOAD_KEYS = {
    "reachable",
    "overloaded",
    "vram_pct",
    "gpu_util_pct",
    "queue_pending",
    "queue_running",
    "guard_busy",
    "guard_job",
    "reasons",
    "errors",
    "measured_at",
    "thresholds",
}


def every_command(parser: argparse.ArgumentParser, path: list[str]) -> list[list[str]]:
    found = [path]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += every_command(sub, [*path, name])
    return found


@pytest.mark.full  # the installed script, in a process of its own
async def test_the_installed_command_has_help(cli_env):
    code, out, err = await spillway_process("--help", env=cli_env())
    assert code == 0 and "usage: spillway" in out and err == ""


@pytest.mark.parametrize("command", every_command(build_parser(), []), ids=" ".join)
def test_every_help_text_renders(command, capsys):
    """argparse formats help lazily: a stray % in one help string crashes only that --help."""
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args([*command, "--help"])
    assert done.value.code == 0 and "usage: spillway" in capsys.readouterr().out


async def test_submit_help_says_a_callback_url_is_in_the_history_and_where_secrets_go(cli_env):
    code, out, _ = await spillway("submit", "--help", env=cli_env())
    text = " ".join(out.split())
    assert code == 0
    assert "--priority 1..5" in text and "--input NODE=PATH" in text
    assert "travels in the job's input and so in its history" in text
    assert "belongs in JOB_WEBHOOK_URL on the workers" in text


@pytest.mark.parametrize("args", [[], ["lod"], ["load", "--jsn"], ["health", "extra"]])
async def test_usage_errors_exit_2_with_one_line(cli_env, args):
    code, out, err = await spillway(*args, env=cli_env())
    assert code == 2 and out == ""
    assert "--help" in one_line(err)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--day", "5"], "SPILLWAY_LEDGER_SECRET"),
        (["--day", "five"], "--day"),
        (["--month", "-1"], "--month"),
        (["--month", "2026-11", "--day", "5"], "--month YYYY-MM"),
    ],
)
async def test_a_budget_order_the_ledger_cannot_take_exits_2_with_one_line(cli_env, args, named):
    """Before Temporal is asked: nothing is sent."""
    code, out, err = await spillway("budget", *args, "--by", "ana", env=cli_env())
    assert code == 2 and out == ""
    assert named in one_line(err)


async def test_load_json_shows_the_seed_guard_case(cli_env, comfyui, guard):
    guard.hold("sim_video_job_123")
    env = cli_env(COMFYUI_URL=comfyui.url, A40_GUARD_URL=guard.url)
    code, out, err = await spillway("load", "--json", env=env)
    assert code == 0, err
    status = json.loads(out)
    assert set(status) >= LOAD_KEYS
    assert status["reachable"] and status["overloaded"] and status["guard_busy"]
    assert status["vram_pct"] == FREE_VRAM_PCT
    assert status["reasons"] == ["a40_guard_busy_job=sim_video_job_123"]
    # No NVIDIA driver here: the probe still answers and lists that once.
    assert [e for e in status["errors"] if e.startswith("nvml: ")] == [status["errors"][0]]
    assert len(status["errors"]) == 1 and "Traceback" not in out + err


async def test_load_exits_0_when_every_source_fails(cli_env, refused_url):
    env = cli_env(COMFYUI_URL=refused_url, A40_GUARD_URL=refused_url)
    code, out, err = await spillway("load", env=env)
    assert code == 0 and err == ""
    assert "not overloaded; ComfyUI UNREACHABLE" in out
    assert out.count("  error ") == 4  # system_stats, queue, nvml, guard


@pytest.mark.full  # the installed script, in a process of its own
async def test_load_with_every_source_hanging_returns_within_timeout_plus_one_second(
    cli_env, comfyui, guard
):
    env = cli_env(COMFYUI_URL=comfyui.url, A40_GUARD_URL=guard.url, LOAD_PROBE_TIMEOUT_S="2")
    # Against the same command with healthy sources, so a slow process start on a busy machine
    # counts on both sides: what is left is what the hanging sources cost.
    started = time.monotonic()
    code, _, _ = await spillway_process("load", "--json", env=env)
    healthy = time.monotonic() - started
    comfyui.faults["*"] = "hang"
    guard.faults["*"] = "hang"
    started = time.monotonic()
    code, out, _ = await spillway_process("load", "--json", env=env)
    hanging = time.monotonic() - started
    assert code == 0 and not json.loads(out)["reachable"]
    assert hanging - healthy < 2 + 1, f"healthy {healthy:.2f}s, all hanging {hanging:.2f}s"


async def test_health_shows_trigger_logic_and_never_the_key(cli_env, comfyui, guard):
    key = "mm-" + uuid.uuid4().hex
    (nothing_there,) = free_ports(1)
    env = cli_env(
        COMFYUI_URL=comfyui.url,
        A40_GUARD_URL=guard.url,
        CLOUD_VIDEO_FALLBACK_ENABLED="1",
        MINIMAX_API_KEY=key,
        APPROVAL_TIMEOUT_S="600",
        # No Temporal, so no worker answers: not whatever server this machine runs on 7233.
        TEMPORAL_ADDRESS=f"127.0.0.1:{nothing_there}",
    )
    code, out, err = await spillway("health", "--json", env=env)
    assert code == 0, err
    health = json.loads(out)
    endpoints = {s["name"]: s["endpoint"] for s in health["sources"]}
    assert endpoints["comfyui_vram"] == f"{comfyui.url}/system_stats"
    assert endpoints["a40_guard"] == f"{guard.url}/api/burst/a40-guard/status"
    assert [s["rule"] for s in health["sources"]][:2] == [
        "VRAM used >= 85%",
        "GPU util >= 95% AND queue_pending >= 1",
    ]
    cloud = health["cloud_fallback"]
    assert cloud | {"base_url": None, "providers": None} == {
        "provider": "minimax",
        "tier": 5,
        "base_url": None,
        "fallback_enabled": True,
        "key_present": True,
        "armed": True,
        "order": ["minimax"],  # Kling has no keys here
        "providers": None,
    }
    assert [(p["name"], p["key_present"]) for p in cloud["providers"]] == [
        ("minimax", True),
        ("kling", False),
    ]
    assert health["approval"]["timeout_s"] == 600
    assert (health["approval"]["signed"], health["approval"]["workers_signed"]) == (False, None)
    assert "anyone who can signal the namespace" in health["approval"]["who_can_approve"]
    assert health["load"]["vram_pct"] == FREE_VRAM_PCT

    code, text, _ = await spillway("health", env=env)
    assert code == 0 and "armed yes" in text and "waits 600s" in text
    assert "the GPU pool re-probes each host with a free place every 2s" in text
    assert "who can approve: anyone who can signal the namespace" in text
    assert "set SPILLWAY_APPROVAL_SECRET" in text
    assert key not in out + err + text

    secret = "approval-" + uuid.uuid4().hex
    code, signed, err = await spillway(
        "health", "--json", env=env | {"SPILLWAY_APPROVAL_SECRET": secret}
    )
    assert code == 0, err
    assert json.loads(signed)["approval"]["signed"] is True
    assert secret not in signed + err


async def test_unparsable_threshold_exits_2_naming_the_setting(cli_env):
    code, out, err = await spillway("load", env=cli_env(A40_VRAM_BUSY_PCT="abc"))
    assert code == 2 and out == ""
    assert "A40_VRAM_BUSY_PCT" in one_line(err)


async def test_broken_routing_tiers_exit_2_naming_the_field(cli_env, tmp_path):
    broken = tmp_path / "routing_tiers.json"
    broken.write_text('{"video_tiers": [{"tier": 1, "name": "a40", "provider": "comfyui"}]}')
    code, _, err = await spillway("health", env=cli_env(SPILLWAY_ROUTING_TIERS=str(broken)))
    assert code == 2
    assert "video_tiers.0.location" in one_line(err)


async def test_init_registers_search_attributes_once_and_submit_asks_for_it(
    cli_env, dev_env: WorkflowEnvironment, tmp_path
):
    namespace = f"init-{uuid.uuid4().hex[:8]}"
    await dev_env.client.workflow_service.register_namespace(
        RegisterNamespaceRequest(
            namespace=namespace, workflow_execution_retention_period=Duration(seconds=86400)
        )
    )
    address = dev_env.client.service_client.config.target_host
    env = cli_env(TEMPORAL_ADDRESS=address, TEMPORAL_NAMESPACE=namespace)

    graph = tmp_path / "graph.json"
    graph.write_text(json.dumps(VIDEO_GRAPH))
    code, out, err = await spillway("submit", "--graph", str(graph), env=env)
    assert code == 1 and out == ""
    assert "SpillwayState: run `spillway init` once for this namespace" in one_line(err)
    code, _, err = await spillway("submit", "--graph", str(graph), "--team", "studio", env=env)
    assert code == 1 and "run `spillway init` once for this namespace" in one_line(err)

    secrets = tmp_path / "secrets"
    code, out, err = await spillway("init", env=env | {"SPILLWAY_SECRETS_DIR": str(secrets)})
    assert code == 0, err
    added = (
        "SpillwayHost, SpillwayOverloaded, SpillwayRoute, SpillwayState, SpillwayTeam, "
        "SpillwayTrigger"
    )
    assert f"added {added}" in out
    # The spend ledger's secret, made where the workers read it, for their owner only.
    made = secrets / "SPILLWAY_LEDGER_SECRET"
    assert f"SPILLWAY_LEDGER_SECRET: made in {secrets}" in out
    assert made.stat().st_mode & 0o777 == 0o600
    assert len(made.read_text().strip()) == 64 and made.read_text().strip() not in out + err
    secret = made.read_text()
    code, out, _ = await spillway("init", env=env | {"SPILLWAY_SECRETS_DIR": str(secrets)})
    assert code == 0 and "all present already" in out
    assert "SPILLWAY_LEDGER_SECRET: set" in out and made.read_text() == secret
    code, out, _ = await spillway("init", env=env)
    assert code == 0 and "SPILLWAY_LEDGER_SECRET: not set" in out and "openssl rand" in out

    listed = await dev_env.client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace)
    )
    assert {k.name for k in search_attributes.ALL} <= set(listed.custom_attributes)


@pytest.mark.full  # the installed script, in a process of its own
async def test_init_without_a_temporal_server_exits_1_with_one_line(cli_env, refused_url):
    # The installed script: a failed connection must not crash it on the way out (os._exit).
    address = refused_url.removeprefix("http://")
    code, _, err = await spillway_process("init", env=cli_env(TEMPORAL_ADDRESS=address))
    assert code == 1
    assert f"cannot reach Temporal at {address}" in one_line(err)


def _line_of(why: str, job_id: str) -> PoolView:
    since = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
    waits = InLine(
        job_id=job_id, priority=3, since=since, mode="any", position=1, eta_s=40.0, why=why,
        patience_until=since + timedelta(minutes=5),
    )  # fmt: skip
    host = HostPlaces(name="a40_local", max_jobs=1, places=[], reachable=True, headroom=False)
    return PoolView(hosts=[host], line=[waits])


def test_queue_shows_each_why_whole_wrapped_in_100_columns_or_on_one_row_with_wide():
    why = (
        "places taken (a40_local 1/1; a40_spare drained by ops-bär: swapping the PSU, back "
        "after lunch)"
    )
    job_id = "job-20261206T120000-" + "x" * 40
    whole = f"{why}; cloud at 12:05:00"
    assert build_parser().parse_args(["queue", "--wide"]).wide

    lines = render_queue(_line_of(why, job_id)).splitlines()
    head = lines.index(next(line for line in lines if line.startswith("     1  ")))
    column = lines[head - 1].index("why")
    rows = lines[head:]
    assert max(len(line) for line in lines) <= 100
    assert all(not line[:column].strip() for line in rows[1:])  # under the why column
    assert " ".join(line[column:] for line in rows) == whole

    wide = render_queue(_line_of(why, job_id), wide=True).splitlines()
    assert wide[-1].endswith(f"  {whole}") and job_id in wide[-1]


def test_watch_prints_each_change_of_progress_as_status_shows_it(capsys):
    """`watch` and `submit --wait` printed only "— running" while `status` showed the node."""
    from spillway.cli.commands import _progress_printer
    from spillway.core.models import Plan, Progress

    show = _progress_printer()
    for node, value in (("3", None), ("12", 7), ("12", 7), ("12", 15)):
        progress = Progress(phase="running", node=node, value=value, max=30)
        if value is not None:
            progress.percent = 100 * value / 30
        show(Plan(job_id="job-1", state="running_local", route="local", progress=progress))
    lines = [line.split(" ", 1)[1] for line in capsys.readouterr().err.splitlines()]
    assert lines == [
        "job-1: running_local local — running node 3",
        "job-1: running_local local — running node 12 7/30 (23%)",
        "job-1: running_local local — running node 12 15/30 (50%)",
    ]
