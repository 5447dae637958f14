"""A job's input images, stored before it starts (docs/design.md, "Clients, inputs and outputs"):
what `spillway submit --input` runs. Each file is read, checked and stored once in the output
store (`<prefix>/<job id>/inputs/<sha256>.<ext>`, or the local folder); the job carries the
`JobInput`s, so no image bytes ever travel in workflow input or history."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from activities.storage.opening import open_output_store
from activities.storage.store import StoreError, UnsafeName, chunks_of
from spillway.core.errors import ConfigError, Failed
from spillway.core.images import MAX_INPUT_BYTES, MAX_URL_CHARS, check_image, image_loaders
from spillway.core.models import IMAGE_LOADERS, JobInput
from spillway.core.settings import Settings


def _describe(graph: Mapping[str, Any], node_ids: list[str]) -> str:
    return ", ".join(f"{n} ({graph[n].get('class_type')})" for n in node_ids) or "none"


def _is_url(text: str) -> bool:
    return text.startswith(("http://", "https://"))


def _target(spec: str, graph: Mapping[str, Any], loaders: list[str]) -> tuple[str, str]:
    """(node id, path or URL) of one `--input` spec: NODE=PATH, NODE=URL, or a bare PATH/URL."""
    node, sep, source = spec.partition("=")
    named = bool(sep) and not _is_url(spec) and "/" not in node and not Path(spec).exists()
    if not named:
        node, source = "", spec
    if not source:
        raise ConfigError(f"--input {spec!r}: give NODE=PATH, NODE=URL, or a PATH")
    if _is_url(source) and (len(source) > MAX_URL_CHARS or not urlsplit(source).hostname):
        raise ConfigError(f"--input {node or '?'}=URL: not a URL of at most {MAX_URL_CHARS} chars")
    if not node:
        if len(loaders) != 1:
            many = f"{len(loaders)} image loaders" if loaders else "no image loader"
            todo = f"name one, e.g. --input {loaders[0]}={spec}" if loaders else "add a LoadImage"
            raise ConfigError(
                f"--input {spec}: the graph has {many} ({_describe(graph, loaders)}): {todo}"
            )
        return loaders[0], source
    if node not in graph:
        raise ConfigError(
            f"--input {spec}: node {node} is not in the graph (image loaders: "
            f"{_describe(graph, loaders)})"
        )
    if node not in loaders:
        raise ConfigError(
            f"--input {spec}: node {node} is a {graph[node].get('class_type')}, not an image "
            f"loader ({', '.join(sorted(IMAGE_LOADERS))}); image loaders in the graph: "
            f"{_describe(graph, loaders)}"
        )
    return node, source


def _read(source: str) -> bytes:
    path = Path(source).expanduser()
    try:
        if path.stat().st_size > MAX_INPUT_BYTES:
            raise ConfigError(f"{source} is over {MAX_INPUT_BYTES >> 20} MiB: too large an input")
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read input {source}: {exc.strerror}") from None


async def prepare_inputs(
    settings: Settings, job_id: str, graph: Mapping[str, Any], specs: list[str], cloud: bool
) -> list[JobInput]:
    """The job's inputs, in the order given, each file checked and stored once; a URL is
    referenced as it is (sha256 None, not fetched). With `cloud`, the first image must also be
    one MiniMax takes as first_frame_image. ConfigError (one line) for any bad input or setting,
    Failed when the store could not be reached."""
    if not specs:
        return []
    loaders = image_loaders(graph)
    targets = [_target(spec, graph, loaders) for spec in specs]
    seen = [node for node, _ in targets]
    if twice := sorted({n for n in seen if seen.count(n) > 1}):
        raise ConfigError(f"--input names node {', '.join(twice)} more than once")
    read = await asyncio.gather(
        *(asyncio.to_thread(_read, s) for _, s in targets if not _is_url(s))
    )
    contents = iter(read)
    prepared: list[tuple[str, str, bytes | None]] = []
    for index, (node, source) in enumerate(targets):
        data = None if _is_url(source) else next(contents)
        if data is not None:
            check_image(data, source, first_frame=cloud and index == 0)
        prepared.append((node, source, data))
    return await _store(settings, job_id, prepared)


async def _store(
    settings: Settings, job_id: str, prepared: list[tuple[str, str, bytes | None]]
) -> list[JobInput]:
    inputs: list[JobInput] = []
    stored: dict[str, str] = {}  # sha256 -> uri: the same file for two nodes is stored once
    try:
        async with open_output_store(settings) as store:
            for node, source, data in prepared:
                # The file's own name, shown in status; a URL's query (a signature?) is not.
                shown = urlsplit(source).path if _is_url(source) else source
                name = PurePosixPath(shown.replace("\\", "/")).name[:200] or None
                if data is None:
                    inputs.append(JobInput(node=node, uri=source, name=name))
                    continue
                sha256 = hashlib.sha256(data).hexdigest()
                if sha256 not in stored:
                    key = f"inputs/{sha256}.{check_image(data, source, first_frame=False).ext}"
                    found = await store.find(job_id, key)
                    found = found or await store.put(job_id, key, chunks_of(data), len(data))
                    stored[sha256] = found.uri
                inputs.append(JobInput(node=node, uri=stored[sha256], sha256=sha256, name=name))
    except UnsafeName as exc:
        raise ConfigError(f"job id {job_id!r}: {exc}") from None
    except StoreError as exc:
        if exc.retryable:
            raise Failed(f"storing the inputs failed: {exc}") from None
        raise ConfigError(f"storing the inputs failed: {exc}") from None
    return inputs
