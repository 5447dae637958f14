"""Two GPU hosts, each a ComfyUI double with its own agent, the worker apart from them, all on the
real dev server (docs/design.md, "GPU hosts and agents"): a job runs where there is headroom, both
busy means a person decides (or the cloud, when armed), an agent that is down is skipped within
the probe bound, a job on host B is cancelled on B, and `spillway health` shows what the workers
and the agents see."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.testing import WorkflowEnvironment

from spillway.core.models import Plan
from spillway.core.settings import Settings
from spillway.core.tiers import load_tiers
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from tests.support.cli import spillway
from tests.support.constants import BUSY_VRAM_PCT, CANARY_KEY, FREE_VRAM_PCT
from tests.support.graphs import SLOW_GRAPH, VIDEO_GRAPH
from tests.support.jobs import Jobs
from tests.support.settings import make_settings, two_host_tiers
from worker import serving
from workflows.activity_calls import PROBE_BOUND


@pytest.fixture
async def gpu_b() -> AsyncIterator[ComfyUISim]:
    async with ComfyUISim() as sim:
        sim.set_vram_used_pct(FREE_VRAM_PCT)
        yield sim


class TwoHosts:
    """The worker (no agents) and one agent per host, each a context of its own to stop."""

    def __init__(self, env: WorkflowEnvironment, settings: Settings) -> None:
        self.env, self.settings = env, settings
        self.tiers = load_tiers(settings.SPILLWAY_ROUTING_TIERS)
        self.jobs = Jobs(env.client, settings.SPILLWAY_TASK_QUEUE)
        self.agents: dict[str, AsyncExitStack] = {}

    async def start_agent(self, host: str) -> None:
        stack = AsyncExitStack()
        await stack.enter_async_context(
            serving(self.env.client, self.settings, self.tiers, only_host=host)
        )
        self.agents[host] = stack

    async def stop_agent(self, host: str) -> None:
        await self.agents.pop(host).aclose()


@pytest.fixture
def two_hosts(dev_env, comfyui: ComfyUISim, gpu_b: ComfyUISim, tmp_path: Path, gpu):
    @asynccontextmanager
    async def run(**overrides: Any) -> AsyncIterator[TwoHosts]:
        settings = make_settings(
            SPILLWAY_TASK_QUEUE=f"hosts-{uuid.uuid4()}",
            SPILLWAY_ROUTING_TIERS=two_host_tiers(
                tmp_path, {"name": "gpu-a", "comfyui_url": comfyui.url}, {"comfyui_url": gpu_b.url}
            ),
            SPILLWAY_OUTPUT_DIR=tmp_path / "outputs",
            SPILLWAY_HEARTBEAT_TIMEOUT_S=2,
            LOAD_PROBE_TIMEOUT_S=1,
            COMFYUI_HISTORY_POLL_S=0.1,
            UNREACHABLE_CONFIRM_S=1,
            **overrides,
        )
        hosts = TwoHosts(dev_env, settings)
        tiers = hosts.tiers
        async with serving(dev_env.client, settings, tiers, agents=False, gpu=gpu):
            await hosts.start_agent("gpu-a")
            await hosts.start_agent("gpu-b")
            try:
                yield hosts
            finally:
                for host in list(hosts.agents):
                    await hosts.stop_agent(host)

    return run


async def test_a_job_runs_on_the_host_with_headroom(two_hosts, comfyui, gpu_b):
    comfyui.set_vram_used_pct(BUSY_VRAM_PCT)  # gpu-a is busy, gpu-b free
    async with two_hosts() as hosts:
        plan: Plan = await (await hosts.jobs.start(prompt=None, graph=VIDEO_GRAPH)).result()
    assert (plan.state, plan.route, plan.host) == ("completed", "local", "gpu-b")
    assert plan.prompt_id is not None and gpu_b.prompt_posts[plan.prompt_id] == 1
    assert sum(comfyui.prompt_posts.values()) == 0


async def test_with_both_hosts_free_the_one_with_less_backlog_wins(two_hosts, comfyui, gpu_b):
    comfyui.set_queue(running=1, pending=2)
    async with two_hosts() as hosts:
        plan: Plan = await (await hosts.jobs.start(prompt=None, graph=VIDEO_GRAPH)).result()
    assert plan.host == "gpu-b"
    signal = plan.overflow.last_signal
    assert signal is None  # no overflow: the decision kept no reading


async def test_both_hosts_busy_and_unarmed_waits_for_a_person_with_both_readings(
    two_hosts, comfyui, gpu_b
):
    comfyui.set_vram_used_pct(BUSY_VRAM_PCT)
    gpu_b.set_vram_used_pct(BUSY_VRAM_PCT)
    async with two_hosts(MINIMAX_API_KEY=CANARY_KEY, APPROVAL_TIMEOUT_S=600) as hosts:
        handle = await hosts.jobs.start(prompt="a lighthouse", graph=VIDEO_GRAPH)
        plan = await hosts.jobs.until(handle, lambda p: p.state == "awaiting_approval")
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await handle.result()
    signal = plan.overflow.last_signal
    assert signal is not None and signal.overloaded and set(signal.hosts) == {"gpu-a", "gpu-b"}
    assert all(r.overloaded and r.host == name for name, r in signal.hosts.items())
    assert plan.reasons == [
        f"gpu-a:vram_used_{BUSY_VRAM_PCT}pct_ge_85.0pct",
        f"gpu-b:vram_used_{BUSY_VRAM_PCT}pct_ge_85.0pct",
    ]


async def test_both_hosts_busy_and_armed_goes_to_the_cloud(
    two_hosts, comfyui, gpu_b, minimax: MiniMaxSim
):
    comfyui.set_vram_used_pct(BUSY_VRAM_PCT)
    gpu_b.set_vram_used_pct(BUSY_VRAM_PCT)
    armed = {
        "MINIMAX_API_KEY": CANARY_KEY,
        "MINIMAX_BASE_URL": minimax.url,
        "CLOUD_VIDEO_FALLBACK_ENABLED": True,
        "MINIMAX_POLL_INTERVAL_S": 0.1,
    }
    async with two_hosts(**armed) as hosts:
        plan: Plan = await (
            await hosts.jobs.start(prompt="a lighthouse", graph=VIDEO_GRAPH)
        ).result()
    assert (plan.state, plan.route, plan.host) == ("completed", "cloud", None)
    assert minimax.create_calls == 1


async def test_a_host_whose_agent_is_down_is_skipped_within_the_probe_bound(
    two_hosts, comfyui, gpu_b
):
    async with two_hosts() as hosts:
        await hosts.stop_agent("gpu-b")  # gpu-b's ComfyUI is up, its agent is not
        comfyui.set_queue(running=3)  # gpu-b would win on backlog, if it answered
        started = asyncio.get_running_loop().time()
        plan: Plan = await (await hosts.jobs.start(prompt=None, graph=VIDEO_GRAPH)).result()
        took = asyncio.get_running_loop().time() - started
    assert (plan.state, plan.host) == ("completed", "gpu-a")
    assert sum(gpu_b.prompt_posts.values()) == 0
    assert took < PROBE_BOUND.total_seconds() + 20  # bounded, never a hang


async def test_a_job_on_host_b_is_cancelled_on_b(two_hosts, comfyui, gpu_b):
    comfyui.set_vram_used_pct(BUSY_VRAM_PCT)
    gpu_b.execution_s = 30
    async with two_hosts() as hosts:
        handle = await hosts.jobs.start(prompt=None, graph=SLOW_GRAPH)
        plan = await hosts.jobs.until(handle, lambda p: p.state == "running_local")
        assert plan.prompt_id is not None and plan.host == "gpu-b"
        await gpu_b.wait_until(plan.prompt_id, "running")
        await handle.cancel()
        ended = await hosts.jobs.until(handle, lambda p: p.state == "cancelled")
    assert gpu_b.state_of(plan.prompt_id) not in ("pending", "running")
    assert "comfyui_prompt_running_cancelled" in ended.reasons
    assert sum(comfyui.prompt_posts.values()) == 0


async def test_health_shows_what_the_workers_and_each_agent_see(two_hosts, cli_env, dev_env):
    async with two_hosts() as hosts:
        await hosts.stop_agent("gpu-b")
        env = cli_env(
            TEMPORAL_ADDRESS=dev_env.client.service_client.config.target_host,
            SPILLWAY_TASK_QUEUE=hosts.settings.SPILLWAY_TASK_QUEUE,
        )
        code, out, err = await spillway("health", "--json", env=env)
        _, text, _ = await spillway("health", env=env)
    assert code == 0, err
    # What the workers see, then what this shell sees, each under its own label: the shell's key
    # or fallback switch read under "Workers see" would say the opposite of what jobs do.
    lines = text.splitlines()
    labels = ("Workers see:", "This shell sees", "Trigger:", "Cloud fallback:", "Load now")
    at = {label: [n for n, line in enumerate(lines) if line.startswith(label)] for label in labels}
    assert all(len(found) == 1 for found in at.values()), at
    assert [found[0] for found in at.values()] == sorted(found[0] for found in at.values()), at
    assert "from this shell" in lines[at["Load now"][0]]
    workers = json.loads(out)["workers"]["view"]
    views = {h["name"]: h for h in workers["hosts"]}
    assert views["gpu-a"]["load"]["reachable"] and views["gpu-a"]["load"]["agent"]
    assert views["gpu-b"]["load"] is None and "no agent answered" in views["gpu-b"]["error"]
    assert workers["policy"]["hosts"][1]["task_queue"].endswith("-gpu-gpu-b")
