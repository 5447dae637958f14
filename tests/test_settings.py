"""Settings from the environment and routing_tiers.json, validated with clear messages."""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

import worker
from activities.cloud import registry
from spillway.core.errors import ConfigError
from spillway.core.settings import PROJECT_ROOT, Settings, load_settings, shown, webhook_key
from spillway.core.tiers import load_tiers
from tests.support.settings import two_host_tiers


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, cli_env) -> pytest.MonkeyPatch:
    import os

    for name in set(os.environ) - set(cli_env()):
        monkeypatch.delenv(name)
    return monkeypatch


def test_defaults_are_the_seeds(clean_env):
    s = load_settings()
    assert str(s.COMFYUI_URL) == "http://127.0.0.1:8188/"
    assert (s.A40_VRAM_BUSY_PCT, s.A40_UTIL_BUSY_PCT, s.A40_NVML_INDEX) == (85, 95, 0)
    assert s.LOAD_PROBE_TIMEOUT_S == 2 and s.UNREACHABLE_CONFIRM_S == 5
    assert s.A40_GUARD_URL is None and s.guard_status_url() is None
    assert not s.CLOUD_VIDEO_FALLBACK_ENABLED and not registry.armed(s)
    assert (s.APPROVAL_TIMEOUT_S, s.APPROVAL_RECHECK_S, s.MINIMAX_POLL_INTERVAL_S) == (900, 60, 10)
    assert s.SPILLWAY_TASK_QUEUE == "spillway"


def test_environment_overrides_and_guard_path(clean_env):
    clean_env.setenv("A40_GUARD_URL", "http://vm201:8080/")
    clean_env.setenv("A40_VRAM_BUSY_PCT", "1")
    clean_env.setenv("CLOUD_VIDEO_FALLBACK_ENABLED", "1")
    s = load_settings()
    assert s.guard_status_url() == "http://vm201:8080/api/burst/a40-guard/status"
    assert s.A40_VRAM_BUSY_PCT == 1
    assert s.CLOUD_VIDEO_FALLBACK_ENABLED and not registry.armed(s)  # no key: not armed


def test_armed_needs_switch_and_key(clean_env):
    clean_env.setenv("CLOUD_VIDEO_FALLBACK_ENABLED", "1")
    clean_env.setenv("MINIMAX_API_KEY", "mm-test-key-do-not-print")
    s = load_settings()
    assert registry.armed(s)
    assert "mm-test-key-do-not-print" not in repr(s) and "mm-test-key" not in str(s.model_dump())


def settings_error(clean_env: pytest.MonkeyPatch, name: str, value: str) -> str:
    """What loading the settings says with `name` set to `value` (it must refuse)."""
    clean_env.setenv(name, value)
    with pytest.raises(ConfigError) as raised:
        load_settings()
    return str(raised.value)


# Bad URLs that carry a credential: the refusal must name the setting, never show the value.
SECRET_URLS = [
    ("SPILLWAY_OUTPUT_URL", "https://AKIACANARY:canary-secret@minio:9000/bucket"),
    ("AWS_ENDPOINT_URL", "not-a-url-AKIACANARY:canary-secret"),
    ("JOB_WEBHOOK_URL", "ftp://hooks.example/canary-secret"),
]
BAD_SETTINGS = [
    ("A40_VRAM_BUSY_PCT", "abc"),
    ("A40_UTIL_BUSY_PCT", "0"),
    ("A40_VRAM_BUSY_PCT", "101"),
    ("LOAD_PROBE_TIMEOUT_S", "-1"),
    ("A40_NVML_INDEX", "first"),
    ("COMFYUI_URL", "not a url"),
    ("CLOUD_VIDEO_FALLBACK_ENABLED", "maybe"),
    ("A40_MAX_JOBS", "0"),
    ("A40_MAX_JOBS", "two"),
    ("SPILLWAY_POOL_REPROBE_S", "0.4"),
    ("SPILLWAY_POOL_LINE_CHECK_S", "0"),
    ("SPILLWAY_POOL_SIGNALS_IN_FLIGHT", "0"),
    ("CLOUD_DAILY_BUDGET_USD", "nan"),
    ("CLOUD_MONTHLY_BUDGET_USD", "-5"),
    ("CLOUD_MONTHLY_BUDGET_USD", "inf"),
    *SECRET_URLS,
]


@pytest.mark.parametrize(("name", "value"), BAD_SETTINGS)
def test_bad_setting_names_the_setting_in_one_line(clean_env, name, value):
    message = settings_error(clean_env, name, value)
    assert name in message and "\n" not in message


def test_the_committed_routing_tiers_are_valid():
    tiers = load_tiers(PROJECT_ROOT / "routing_tiers.json")
    local, minimax = tiers.by_provider("comfyui"), tiers.by_provider("minimax")
    assert local is not None and local.tier == 1 and local.location == "local"
    assert minimax is not None and minimax.tier == 5 and minimax.location == "cloud"
    assert "a40_load_signal_2026-07-24" in tiers.meta


def _write(tmp_path: Path, content: str) -> Path:
    path = tmp_path / "routing_tiers.json"
    path.write_text(content)
    return path


def _committed() -> Any:
    return json.loads((PROJECT_ROOT / "routing_tiers.json").read_text())


@pytest.mark.parametrize(
    ("mutate", "named"),
    [
        (lambda t: t["video_tiers"][1].update(provider="run pod"), "video_tiers.1.provider"),
        (lambda t: t["video_tiers"][0].update(tier="one"), "video_tiers.0.tier"),
        (lambda t: t["video_tiers"][2]["estimated_cost_usd"].update(x=-1), "estimated_cost_usd"),
        (lambda t: t["video_tiers"][2].update(tier=1), "unique"),
        (lambda t: t.pop("video_tiers"), "video_tiers"),
        (lambda t: t["video_tiers"][0].update(colour="red"), "video_tiers.0.colour"),
        (lambda t: t["video_tiers"][0].update(max_jobs=-1), "video_tiers.0.max_jobs"),
        (lambda t: t["video_tiers"][0].update(max_jobs=0), "video_tiers.0.max_jobs"),
        (lambda t: t["video_tiers"][0].update(max_jobs=1.5), "video_tiers.0.max_jobs"),
        (
            lambda t: t["video_tiers"][0].update(comfyui_url="http://ops:2024/Secret@gpu:8188"),
            "video_tiers.0.comfyui_url",
        ),
    ],
)
def test_broken_routing_tiers_name_the_field(tmp_path, mutate, named):
    tiers = _committed()
    mutate(tiers)
    with pytest.raises(ConfigError) as raised:
        load_tiers(_write(tmp_path, json.dumps(tiers)))
    assert named in str(raised.value) and "\n" not in str(raised.value)
    assert "Secret" not in str(raised.value)


def test_a_cloud_provider_spillway_does_not_know_stops_the_worker_naming_it(tmp_path):
    tiers = _committed()
    tiers["video_tiers"][1].update(provider="runpod")
    path = _write(tmp_path, json.dumps(tiers))
    with pytest.raises(ConfigError, match=r"video_tiers\.1\.provider: unknown cloud provider"):
        registry.check(Settings(SPILLWAY_ROUTING_TIERS=path), load_tiers(path))
    with pytest.raises(ConfigError, match="CLOUD_PROVIDERS: unknown provider 'runpod'"):
        registry.check(Settings(CLOUD_PROVIDERS="minimax,runpod"), load_tiers(path))


@pytest.mark.full  # the worker in a process of its own
async def test_a_worker_with_a_key_and_no_ledger_secret_exits_naming_it(
    cli_env, refused_url, tmp_path
):
    env = cli_env(MINIMAX_API_KEY="mm-key", TEMPORAL_ADDRESS=refused_url.removeprefix("http://"))
    code, err = await worker_process(env)
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "SPILLWAY_LEDGER_SECRET is not set, and this worker holds keys for minimax" in err
    assert "openssl rand -hex 32" in err and "mm-key" not in err

    # From a secrets folder (an empty setting, as compose's .env has it, leaves it to the file),
    # the worker gets as far as Temporal.
    (tmp_path / "SPILLWAY_LEDGER_SECRET").write_text("s" * 32 + "\n")
    env |= {"SPILLWAY_SECRETS_DIR": str(tmp_path), "SPILLWAY_LEDGER_SECRET": ""}
    code, err = await worker_process(env)
    assert code == 1 and "cannot reach Temporal" in err, err


def test_a_secrets_folder_completes_what_the_environment_leaves_empty(clean_env, tmp_path):
    (tmp_path / "SPILLWAY_LEDGER_SECRET").write_text("from-the-file-" * 3 + "\n")
    clean_env.setenv("SPILLWAY_SECRETS_DIR", str(tmp_path))
    assert secret_value(load_settings().SPILLWAY_LEDGER_SECRET) == "from-the-file-" * 3
    clean_env.setenv("SPILLWAY_LEDGER_SECRET", "from-the-environment")
    assert secret_value(load_settings().SPILLWAY_LEDGER_SECRET) == "from-the-environment"
    (tmp_path / "SPILLWAY_APPROVAL_SECRET").write_text("short")
    with pytest.raises(ConfigError, match="SPILLWAY_APPROVAL_SECRET") as raised:
        load_settings()
    assert "short" not in str(raised.value)
    clean_env.setenv("SPILLWAY_SECRETS_DIR", str(tmp_path / "SPILLWAY_APPROVAL_SECRET"))
    with pytest.raises(ConfigError, match="is not a folder"):
        load_settings()


def secret_value(secret: SecretStr | None) -> str | None:
    return None if secret is None else secret.get_secret_value()


async def worker_process(env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(PROJECT_ROOT / "worker.py"), env=env, cwd=PROJECT_ROOT,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, err.decode()


@pytest.mark.parametrize(
    "second",
    [
        "http://ops:hunter2@gpu-a:8188",
        "HTTP://GPU-A:8188/",
        "http://gpu-a:8188//",
        "http://gpu-a:8188/?token=hunter2",
    ],
)
def test_two_gpu_hosts_at_one_comfyui_are_refused_naming_both(tmp_path, second):
    path = two_host_tiers(tmp_path, {"comfyui_url": "http://gpu-a:8188/"}, {"comfyui_url": second})
    with pytest.raises(ConfigError) as raised:
        load_tiers(path)
    message = str(raised.value)
    assert "GPU hosts a40_local and gpu-b share one ComfyUI (http://gpu-a:8188/)" in message
    assert "hunter2" not in message and "\n" not in message


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("http://gpu-a:8188", "http://gpu-a:8189"),
        ("http://gpu-a:8188", "https://gpu-a:8188"),
        ("http://gpu:8188/a", "http://gpu:8188/b"),
        ("http://gpu-a", "http://gpu-a:8080"),
        # Each agent's own machine (docs/operations.md, "Production on two machines").
        ("http://127.0.0.1:8188", "http://127.0.0.1:8188"),
        ("http://localhost:8188", "http://LOCALHOST:8188/"),
    ],
)
def test_gpu_hosts_at_other_ports_schemes_paths_or_machines_are_two_comfyuis(
    tmp_path, first, second
):
    path = two_host_tiers(tmp_path, {"comfyui_url": first}, {"comfyui_url": second})
    assert len([t for t in load_tiers(path).video_tiers if t.location == "local"]) == 2


def test_the_default_port_is_the_same_port(tmp_path):
    tiers = {"comfyui_url": "https://gpu-a/"}, {"comfyui_url": "https://gpu-a:443"}
    with pytest.raises(ConfigError, match="share one ComfyUI"):
        load_tiers(two_host_tiers(tmp_path, *tiers))


async def test_a_worker_with_two_hosts_at_one_comfyui_exits_2_in_one_line(
    clean_env, tmp_path, capsys
):
    first, second = (
        {"comfyui_url": "http://ops:hunter2@gpu:8188"},
        {"comfyui_url": "http://gpu:8188"},
    )
    clean_env.setenv("SPILLWAY_ROUTING_TIERS", str(two_host_tiers(tmp_path, first, second)))
    assert await worker.main() == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "hunter2" not in err
    assert err.startswith("spillway worker: invalid routing tiers ")
    assert "GPU hosts a40_local and gpu-b share one ComfyUI (http://gpu:8188/)" in err


async def test_a_worker_running_both_agents_of_hosts_at_one_loopback_comfyui_exits_2(
    clean_env, tmp_path, capsys
):
    """At a loopback URL two hosts are one ComfyUI where their agents share a machine: the
    worker that runs every agent refuses; one that runs none goes on (here, to a Temporal that
    refuses it)."""
    same = {"comfyui_url": "http://127.0.0.1:8188"}
    clean_env.setenv("SPILLWAY_ROUTING_TIERS", str(two_host_tiers(tmp_path, same, same)))
    clean_env.setenv("TEMPORAL_ADDRESS", "127.0.0.1:9")
    assert await worker.main() == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "GPU hosts a40_local and gpu-b share one ComfyUI (http://127.0.0.1:8188/)" in err
    assert "this worker runs both agents" in err and "spillway agent --host NAME" in err
    assert await worker.main(agents=False) == 1
    assert "cannot reach Temporal" in capsys.readouterr().err


def test_routing_tiers_that_are_not_json_say_so(tmp_path):
    with pytest.raises(ConfigError) as raised:
        load_tiers(_write(tmp_path, '{"video_tiers": [ ,'))
    assert "routing tiers" in str(raised.value) and "JSON" in str(raised.value)


def test_missing_routing_tiers_file_says_which(tmp_path):
    with pytest.raises(ConfigError, match="cannot read routing tiers"):
        load_tiers(tmp_path / "nope.json")


@pytest.mark.parametrize(("name", "value"), SECRET_URLS)
def test_a_bad_storage_or_webhook_url_is_named_but_never_shown(clean_env, name, value):
    message = settings_error(clean_env, name, value)
    assert name in message and "canary-secret" not in message


@pytest.mark.parametrize(
    ("url", "seen"),
    [
        ("http://ops:hunter2@guard:8080/x?sig=abc", "http://guard:8080/x"),
        ("https://token@[::1]/", "https://[::1]/"),
        ("http://127.0.0.1:8188", "http://127.0.0.1:8188"),
        ("http://ops:hunter2@host:notaport", "<a URL that is not well formed>"),
        # Unencoded `/` and `@` in a password: the user-info runs to the last `@`.
        ("http://ops:2024/Secret@comfy:8188", "http://comfy:8188"),
        ("http://ops:p@ss/w@comfy:8188/prompt?sig=a@b", "http://comfy:8188/prompt"),
    ],
)
def test_a_url_is_shown_without_its_user_info_or_query(url: str, seen: str):
    assert shown(url) == seen


@pytest.mark.parametrize(
    "url", ["http://ops:2024/Secret@comfy:8188", "http://ops:p@Secret@comfy:8188"]
)
@pytest.mark.parametrize("name", ["COMFYUI_URL", "A40_GUARD_URL", "MINIMAX_BASE_URL"])
def test_a_url_whose_password_holds_an_unencoded_slash_or_at_is_refused_showing_none_of_it(
    clean_env, name: str, url: str
):
    message = settings_error(clean_env, name, url)
    assert name in message and "percent-encode" in message and "\n" not in message
    assert "Secret" not in message and "2024" not in message and "ops" not in message


def test_an_encoded_password_is_taken_and_shown_without_its_user_info(clean_env):
    clean_env.setenv("COMFYUI_URL", "http://ops:2024%2FSecret%40x@comfy:8188")
    settings = load_settings()
    assert shown(settings.COMFYUI_URL) == "http://comfy:8188/"


def test_an_http_error_quoting_a_url_shows_none_of_its_user_info():
    import httpx

    from activities.http import why

    for url in ("http://ops:2024/Secret@comfy:8188/prompt", "http://ops:p@Secret@comfy/x?a=1"):
        text = why(httpx.ConnectError(f"Client error for url '{url}'"))
        assert "Secret" not in text and "ops" not in text and "comfy" in text, text


def test_a_bad_url_setting_is_named_without_its_password(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("A40_GUARD_URL", "ftp://ops:hunter2@guard")
    with pytest.raises(ConfigError) as failed:
        load_settings()
    assert "A40_GUARD_URL" in str(failed.value) and "hunter2" not in str(failed.value)


def test_a_whsec_webhook_secret_keys_its_decoded_bytes_and_any_other_its_text(clean_env):
    key = b"\x00spillway-webhook-key-24+"
    encoded = base64.b64encode(key).decode()
    assert webhook_key("whsec_" + encoded) == key
    assert webhook_key("whsec_" + encoded.rstrip("=")) == key  # unpadded, as the spec allows
    assert webhook_key("any raw text, würde") == "any raw text, würde".encode()
    clean_env.setenv("JOB_WEBHOOK_SECRET", "whsec_" + encoded)
    assert load_settings().JOB_WEBHOOK_SECRET is not None


@pytest.mark.parametrize(
    "value", ["whsec_canary-secret!!", "whsec_", "whsec_canar", "whsec_ canary secret"]
)
def test_a_malformed_whsec_webhook_secret_is_refused_at_load_without_showing_it(clean_env, value):
    message = settings_error(clean_env, "JOB_WEBHOOK_SECRET", value)
    assert "JOB_WEBHOOK_SECRET" in message and "must be base64 after the prefix" in message
    assert "canar" not in message
