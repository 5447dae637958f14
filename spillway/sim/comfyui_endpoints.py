"""The ComfyUI double's answers that need no queue (spillway/sim/comfyui.py): the input folder
that `POST /upload/image` writes and LoadImage reads, `GET /view`, which serves outputs (their
bytes generated from their names, spillway/sim/comfyui_content.py) and inputs, and
`GET /system_stats` of an A40.

Uploads answer like ComfyUI 0.3.64's `image_upload` (tests/comfyui_transcripts/upload_image_*):
with `overwrite=true` the file is replaced; without it the same name AND the same bytes reuse the
file, the same name with other bytes is stored as `name (1).png`; a subfolder that leaves the
input folder answers 400 with an empty body.
"""

from __future__ import annotations

import posixpath
from typing import Any

from aiohttp import web

from spillway.sim import comfyui_content as content
from spillway.sim import comfyui_graph as graph

# An A40 as ComfyUI reports it: 48 GB card, ~45 GiB visible to torch.
A40_NAME = "cuda:0 NVIDIA A40 : cudaMallocAsync"
A40_VRAM_TOTAL = 45 * 1024**3


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
    mime = content.MIME_TYPES.get(filename.rsplit(".", 1)[-1], "application/octet-stream")
    headers = {"Content-Disposition": f'filename="{filename}"', "Content-Type": mime}
    if kind == "input":
        data = inputs.files.get(_inside(posixpath.join(subfolder, filename)) or "")
        if data is None:
            return web.Response(status=404)
        return web.Response(body=data, headers=headers)
    key = graph.file_key(kind, subfolder, filename)
    size = outputs.get(key)
    if size is None:
        return web.Response(status=404)
    response = web.StreamResponse(headers=headers)
    response.content_length = size
    await response.prepare(request)
    for chunk in content.iter_content(key, size):
        await response.write(chunk)
    await response.write_eof()
    return response


def system_stats(port: int, vram_total: int, vram_free: int) -> dict[str, Any]:
    return {
        "system": {
            "os": "posix",
            "ram_total": 67_280_302_080,
            "ram_free": 51_539_607_552,
            "comfyui_version": "0.3.64",
            "required_frontend_version": "1.27.10",
            "installed_templates_version": "0.1.95",
            "required_templates_version": "0.1.95",
            "python_version": "3.11.7",
            "pytorch_version": "2.14.1+cu130",
            "embedded_python": False,
            "argv": ["main.py", "--listen", "127.0.0.1", "--port", str(port)],
        },
        "devices": [
            {
                "name": A40_NAME,
                "type": "cuda",
                "index": 0,
                "vram_total": vram_total,
                "vram_free": vram_free,
                "torch_vram_total": vram_total,
                "torch_vram_free": vram_free,
            }
        ],
    }
