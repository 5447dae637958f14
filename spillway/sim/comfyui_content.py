"""The bytes and content types of the ComfyUI double's output files.

Output files are never stored: their content is generated from their name, block by block, so a
test can serve a 1 GB video without holding it in memory and compute its sha256 independently.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from functools import lru_cache

BLOCK = 1 << 20

MIME_TYPES = {
    "mp4": "video/mp4",
    "webm": "video/webm",
    "webp": "image/webp",
    "png": "image/png",
    "gif": "image/gif",
}


@lru_cache(maxsize=8)
def _pattern(key: str, length: int) -> bytes:
    # SHAKE is a stream: a shorter digest is the start of a longer one, so a small file costs
    # only its own bytes (512-byte outputs had each hashed a whole MiB).
    return hashlib.shake_256(key.encode()).digest(length)


def iter_content(key: str, size: int) -> Iterator[bytes]:
    """The file's bytes in blocks of at most 1 MiB: one block of pseudo-random bytes derived from
    the key, repeated."""
    block = _pattern(key, min(size, BLOCK))
    full, rest = divmod(size, BLOCK)
    for _ in range(full):
        yield block
    if rest:
        yield block[:rest]


def content_sha256(key: str, size: int) -> str:
    digest = hashlib.sha256()
    for chunk in iter_content(key, size):
        digest.update(chunk)
    return digest.hexdigest()
