"""Input images of image-to-video jobs (docs/design.md, "Clients, inputs and outputs"), read and
checked without I/O: what kind of image some bytes are and how large (off the file headers: PNG
IHDR, JPEG SOFn, WebP VP8/VP8L/VP8X, no image library needed), whether the cloud takes it as a
first frame, and a graph's image loaders pointed at uploaded files (`with_inputs`, which the
workflow uses). spillway/client/inputs.py stores a job's inputs before it starts.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from spillway.core.errors import ConfigError
from spillway.core.models import IMAGE_LOADERS

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
