"""ComfyUI's folders as the double keeps them: the input folder that `POST /upload/image` writes
and LoadImage reads, the output and temp files prompts write, and `GET /view`, which serves both.

Output files are never stored: their content is generated from their key, block by block, so a
test can serve a 1 GB video without holding it in memory and compute its sha256 independently.
Like files on disk, both folders outlive a restart of the double.

Uploads answer like ComfyUI 0.3.64's `image_upload` (tests/comfyui_transcripts/upload_image_*):
with `overwrite=true` the file is replaced; without it the same name AND the same bytes reuse the
file, the same name with other bytes is stored as `name (1).png`; a subfolder that leaves the
input folder answers 400 with an empty body.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Iterator
from functools import lru_cache

from aiohttp import web

BLOCK = 1 << 20

MIME_TYPES = {
    "mp4": "video/mp4",
    "webm": "video/webm",
    "webp": "image/webp",
    "png": "image/png",
    "gif": "image/gif",
}


def file_key(kind: str, subfolder: str, filename: str) -> str:
    folder = posixpath.normpath(subfolder) if subfolder else ""
    return f"{kind}/{'' if folder == '.' else folder}/{filename}"


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


class InputFolder:
    """ComfyUI's input folder: path relative to it ("spillway/x.png") -> bytes."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}

    def exists(self, name: str) -> bool:
        """Whether LoadImage's `image` names a file here (ComfyUI strips an " [input]" tag)."""
        key = _inside(name.removesuffix(" [input]"))
        return key is not None and key in self.files

    async def upload(self, request: web.Request) -> web.Response:
        post = await request.post()
        image = post.get("image")
        if not isinstance(image, web.FileField) or not image.filename:
            return web.Response(status=400)
        subfolder = str(post.get("subfolder", ""))
        kind = str(post.get("type") or "input")
        key = _inside(posixpath.join(subfolder, image.filename))
        if key is None or kind != "input":  # the double keeps no temp or output uploads
            return web.Response(status=400)
        data = image.file.read()
        filename, (stem, ext) = image.filename, posixpath.splitext(image.filename)
        if str(post.get("overwrite")) not in ("true", "1"):
            number = 1
            while key in self.files and self.files[key] != data:  # same bytes: reused
                filename = f"{stem} ({number}){ext}"
                key = _inside(posixpath.join(subfolder, filename)) or key
                number += 1
        self.files[key] = data
        return web.json_response({"name": filename, "subfolder": subfolder, "type": kind})


def _inside(path: str) -> str | None:
    """`path` normalised inside the folder, or None when it would leave it."""
    normal = posixpath.normpath(posixpath.join("/input", path))
    return normal.removeprefix("/input/") if normal.startswith("/input/") else None


async def view(
    request: web.Request, outputs: dict[str, int], inputs: InputFolder
) -> web.StreamResponse:
    """GET /view?filename=&subfolder=&type=: an output streamed in blocks, or an input."""
    query = request.rel_url.query
    filename = query.get("filename")
    if filename is None:
        return web.Response(status=404)
    if not filename or filename[0] == "/" or ".." in filename:
        return web.Response(status=400)
    kind = query.get("type", "output")
    if kind not in ("output", "input", "temp"):
        return web.Response(status=400)
    subfolder = query.get("subfolder", "")
    if posixpath.normpath(posixpath.join("/root", subfolder)).split("/")[1:2] != ["root"]:
        return web.Response(status=403)
    filename = posixpath.basename(filename)
    mime = MIME_TYPES.get(filename.rsplit(".", 1)[-1], "application/octet-stream")
    headers = {"Content-Disposition": f'filename="{filename}"', "Content-Type": mime}
    if kind == "input":
        data = inputs.files.get(_inside(posixpath.join(subfolder, filename)) or "")
        if data is None:
            return web.Response(status=404)
        return web.Response(body=data, headers=headers)
    key = file_key(kind, subfolder, filename)
    size = outputs.get(key)
    if size is None:
        return web.Response(status=404)
    response = web.StreamResponse(headers=headers)
    response.content_length = size
    await response.prepare(request)
    for chunk in iter_content(key, size):
        await response.write(chunk)
    await response.write_eof()
    return response
