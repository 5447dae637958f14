"""Input images of image-to-video jobs (docs/design.md, "Clients, inputs and outputs").

`prepare_inputs` is what `spillway submit --input` runs: it reads each file, checks it, stores it
once in the output store (`<prefix>/<job id>/inputs/<sha256>.<ext>`, or the local folder) and
returns the `JobInput`s the job carries, so no image bytes ever travel in workflow input or
history. `with_inputs` is pure: the workflow uses it to point each loader at the name ComfyUI
gave the uploaded file. Image sizes are read off the file headers (PNG IHDR, JPEG SOFn, WebP
VP8/VP8L/VP8X): no image library needed.
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from spillway.errors import ConfigError, Failed
from spillway.models import IMAGE_LOADERS, JobInput

if TYPE_CHECKING:
    from spillway.settings import Settings

MAX_INPUT_BYTES = 50 << 20  # any input: uploads and first frames are read whole
MAX_URL_CHARS = 2000  # JobInput.uri's limit
# MiniMax's first_frame_image (docs/design.md, "MiniMax facts"): JPG/PNG/WebP, under 20 MB,
# short side over 300 px, aspect ratio from 2:5 to 5:2.
FIRST_FRAME_MAX_BYTES = 20_000_000
FIRST_FRAME_MIN_SIDE = 300

Format = Literal["jpeg", "png", "webp", "gif"]
ACCEPTED: tuple[Format, ...] = ("jpeg", "png", "webp")
_EXTENSIONS = {"jpeg": "jpg", "png": "png", "webp": "webp", "gif": "gif"}
# JPEG start-of-frame markers (baseline, progressive, lossless, arithmetic): they carry the size.
_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


@dataclass(frozen=True)
class ImageInfo:
    format: Format
    width: int | None = None  # None: the header was cut short
    height: int | None = None

    @property
    def ext(self) -> str:
        return _EXTENSIONS[self.format]

    @property
    def mime(self) -> str:
        return f"image/{self.format}"


def sniff(data: bytes) -> ImageInfo | None:
    """The image's format and size from its header; None when it is none of JPEG/PNG/WebP/GIF."""
    try:
        if data[:8] == b"\x89PNG\r\n\x1a\n":
            width, height = struct.unpack(">II", data[16:24]) if data[12:16] == b"IHDR" else (0, 0)
            return _info("png", width, height)
        if data[:6] in (b"GIF87a", b"GIF89a"):
            return _info("gif", *struct.unpack("<HH", data[6:10]))
        if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
            return _webp(data)
        if data[:2] == b"\xff\xd8":
            return _jpeg(data)
    except struct.error:
        return _truncated(data)  # a header cut short: the format is known, the size is not
    return None


def _truncated(data: bytes) -> ImageInfo | None:
    formats: tuple[tuple[bytes, Format], ...] = (
        (b"\x89PNG", "png"),
        (b"GIF8", "gif"),
        (b"RIFF", "webp"),
        (b"\xff\xd8", "jpeg"),
    )
    return next((ImageInfo(fmt) for magic, fmt in formats if data.startswith(magic)), None)


def _info(fmt: Format, width: int, height: int) -> ImageInfo:
    return ImageInfo(fmt, width or None, height or None)


def _webp(data: bytes) -> ImageInfo:
    chunk = data[12:16]
    if chunk == b"VP8 ":  # lossy: 14-bit sizes after the frame's start code
        width, height = struct.unpack("<HH", data[26:30])
        return _info("webp", width & 0x3FFF, height & 0x3FFF)
    if chunk == b"VP8L":  # lossless: sizes minus one, 14 bits each
        (bits,) = struct.unpack("<I", data[21:25])
        return _info("webp", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    if chunk == b"VP8X":  # extended: the canvas, 24 bits each, minus one
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        return _info("webp", width, height)
    return ImageInfo("webp")


def _jpeg(data: bytes) -> ImageInfo:
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return ImageInfo("jpeg")  # not at a marker: a broken file
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD9)):  # markers without a length
            i += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image, start of scan: no frame header came
            return ImageInfo("jpeg")
        (length,) = struct.unpack(">H", data[i + 2 : i + 4])
        if marker in _SOF:
            height, width = struct.unpack(">HH", data[i + 5 : i + 9])
            return _info("jpeg", width, height)
        i += 2 + length
    return ImageInfo("jpeg")


def check_image(data: bytes, label: str, *, first_frame: bool) -> ImageInfo:
    """The image's info, or ConfigError (one line) for what neither ComfyUI's LoadImage nor, for
    the cloud's first frame, MiniMax would take."""
    info = sniff(data)
    if info is None or info.format not in ACCEPTED:
        what = "a GIF" if info is not None else "not a JPG, PNG or WebP image"
        raise ConfigError(f"{label} is {what}: inputs must be JPG, PNG or WebP")
    if first_frame and len(data) >= FIRST_FRAME_MAX_BYTES:
        raise ConfigError(
            f"{label} is {len(data)} bytes: MiniMax's first frame must be under 20 MB"
        )
    if len(data) > MAX_INPUT_BYTES:
        raise ConfigError(f"{label} is over {MAX_INPUT_BYTES >> 20} MiB: too large an input")
    if not first_frame:
        return info
    width, height = info.width, info.height
    if width is None or height is None:
        raise ConfigError(f"{label}: its size cannot be read from the {info.format} header")
    if min(width, height) <= FIRST_FRAME_MIN_SIDE:
        raise ConfigError(
            f"{label} is {width}x{height} px: MiniMax's first frame needs a short side over "
            f"{FIRST_FRAME_MIN_SIDE} px"
        )
    if 5 * width < 2 * height or 5 * height < 2 * width:
        raise ConfigError(
            f"{label} is {width}x{height} px (aspect ratio {width / height:.2f}): MiniMax's first "
            "frame must be between 2:5 and 5:2 (0.40 to 2.50)"
        )
    return info


# --- the graph's loaders ---------------------------------------------------------------------


def image_loaders(graph: Mapping[str, Any]) -> list[str]:
    """The node ids of the graph's image loaders, in the graph's order."""
    return [
        node_id
        for node_id, node in graph.items()
        if isinstance(node, dict) and node.get("class_type") in IMAGE_LOADERS
    ]


def with_inputs(graph: Mapping[str, Any], uploaded: Mapping[str, str]) -> dict[str, Any]:
    """The graph with each loader's `image` set to the name ComfyUI gave its upload
    (`subfolder/name`, as LoadImage takes it). Pure; the nodes it changes are copies."""
    result = dict(graph)
    for node_id, name in uploaded.items():
        node = result.get(node_id)
        if not isinstance(node, dict) or node.get("class_type") not in IMAGE_LOADERS:
            raise ValueError(f"node {node_id} is not an image loader of this graph")
        result[node_id] = node | {"inputs": dict(node.get("inputs") or {}) | {"image": name}}
    return result


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
    # Imported here: the workflow imports this module for `with_inputs`, and the store's
    # imports (httpx, aiobotocore) have no business in its sandbox.
    from activities.storage import StoreError, UnsafeName, chunks_of
    from activities.store_opening import open_output_store

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
