"""Image files for the input tests, made here (no image library): `png` writes a real, decodable
grey PNG; `jpeg`, `webp` and `gif` write the headers that carry format and size (all the doubles
and spillway ever read of them), followed by filler bytes. `I2V_GRAPH`: an image-to-video graph
(LoadImage -> CreateVideo -> SaveVideo) whose loader names a file ComfyUI does not have yet."""

from __future__ import annotations

import copy
import struct
import zlib
from typing import Any, Literal

from tests.support.graphs import VIDEO_GRAPH

# VIDEO_GRAPH whose frames come from one LoadImage, saved under "i2v".
I2V_GRAPH: dict[str, Any] = copy.deepcopy(VIDEO_GRAPH)
I2V_GRAPH["1"] = {"class_type": "LoadImage", "inputs": {"image": "placeholder.png"}}
I2V_GRAPH["3"]["inputs"]["filename_prefix"] = "i2v/job"


def _chunk(kind: bytes, data: bytes) -> bytes:
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))


def png(width: int, height: int, shade: int = 128) -> bytes:
    """A grey `width` x `height` PNG; another `shade` gives other bytes."""
    row = b"\x00" + bytes([shade % 256]) * width  # filter 0, one byte per pixel
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit greyscale
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", ihdr)
        + _chunk(b"IDAT", zlib.compress(row * height))
        + _chunk(b"IEND", b"")
    )


def jpeg(width: int, height: int, progressive: bool = False) -> bytes:
    """SOI, an APP0 (JFIF) segment, the frame header (SOF0, or SOF2 when progressive), EOI."""
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    frame = struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    sof = (b"\xff\xc2" if progressive else b"\xff\xc0") + frame
    return b"\xff\xd8" + app0 + sof + b"\x00" * 64 + b"\xff\xd9"


def webp(width: int, height: int, kind: Literal["VP8 ", "VP8L", "VP8X"] = "VP8 ") -> bytes:
    if kind == "VP8 ":
        payload = b"\x00\x00\x00" + b"\x9d\x01\x2a" + struct.pack("<HH", width, height)
    elif kind == "VP8L":
        bits = (width - 1) | ((height - 1) << 14)
        payload = b"\x2f" + struct.pack("<I", bits)
    else:
        sizes = (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
        payload = b"\x00\x00\x00\x00" + sizes
    chunk = kind.encode() + struct.pack("<I", len(payload)) + payload + b"\x00" * 32
    return b"RIFF" + struct.pack("<I", 4 + len(chunk)) + b"WEBP" + chunk


def gif(width: int, height: int) -> bytes:
    return b"GIF89a" + struct.pack("<HH", width, height) + b"\x00" * 32 + b";"
