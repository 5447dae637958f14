"""Input images for image-to-video jobs, as `spillway submit --input` prepares them: each file
read, checked and stored once (the local folder or S3), a URL referenced as it is, every bad
input refused with one line; the sizes read off PNG, JPEG and WebP headers; the graph's loaders
pointed at what ComfyUI named the uploads."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from spillway.client.inputs import prepare_inputs
from spillway.core.errors import ConfigError
from spillway.core.images import ImageInfo, sniff, with_inputs
from spillway.core.settings import Settings
from tests.support.images import gif, jpeg, png, webp

if TYPE_CHECKING:
    from tests.support.s3 import S3Endpoint

pytest_plugins = ["tests.support.s3"]

SAVE = {"class_type": "SaveVideo", "inputs": {"video": ["3", 0], "filename_prefix": "i2v/x"}}
ONE_LOADER: dict[str, Any] = {
    "1": {"class_type": "LoadImage", "inputs": {"image": "example.png"}},
    "2": SAVE,
}
TWO_LOADERS: dict[str, Any] = ONE_LOADER | {
    "5": {"class_type": "LoadImage", "inputs": {"image": "last.png"}}
}


def job() -> str:
    return f"job-{uuid.uuid4().hex[:8]}"


def write(folder: Path, name: str, data: bytes) -> str:
    path = folder / name
    path.write_bytes(data)
    return str(path)


def local(tmp_path: Path) -> Settings:
    return Settings(SPILLWAY_OUTPUT_DIR=tmp_path / "outputs", SPILLWAY_OUTPUT_URL=None)


# --- prepared and stored -----------------------------------------------------------------------


async def test_a_file_is_stored_once_under_its_sha256_and_a_url_is_referenced_as_it_is(
    tmp_path: Path,
):
    data, job_id = png(640, 480), job()
    start = write(tmp_path, "start.png", data)
    url = "https://images.example.com/last.jpg?sig=abc"
    specs = [f"1={start}", f"5={url}"]

    first = await prepare_inputs(local(tmp_path), job_id, TWO_LOADERS, specs, cloud=True)
    again = await prepare_inputs(local(tmp_path), job_id, TWO_LOADERS, specs, cloud=True)

    sha256 = hashlib.sha256(data).hexdigest()
    stored = (tmp_path / "outputs").resolve() / job_id / "inputs" / f"{sha256}.png"
    assert [(i.node, i.uri, i.sha256, i.name) for i in first] == [
        ("1", stored.as_uri(), sha256, "start.png"),
        ("5", url, None, "last.jpg"),
    ]
    assert again == first
    assert stored.read_bytes() == data
    files = [p for p in (tmp_path / "outputs").rglob("*") if p.is_file()]
    assert files == [stored]


async def test_a_bare_path_goes_to_the_graphs_only_loader_and_one_file_for_two_nodes_is_one_object(
    tmp_path: Path,
):
    start = write(tmp_path, "start.webp", webp(1280, 720))
    [bare] = await prepare_inputs(local(tmp_path), job(), ONE_LOADER, [start], cloud=False)
    assert bare.node == "1" and bare.uri.endswith(".webp")

    both = await prepare_inputs(
        local(tmp_path), job(), TWO_LOADERS, [f"1={start}", f"5={start}"], cloud=False
    )
    assert [i.node for i in both] == ["1", "5"] and both[0].uri == both[1].uri


async def test_inputs_go_to_the_bucket_under_the_jobs_prefix_with_their_sha256(
    s3: S3Endpoint, tmp_path: Path
):
    data, job_id = jpeg(1920, 1080), job()
    start = write(tmp_path, "start.jpg", data)
    [item] = await prepare_inputs(s3.settings(), job_id, ONE_LOADER, [start], cloud=True)

    sha256 = hashlib.sha256(data).hexdigest()
    key = f"outputs/{job_id}/inputs/{sha256}.jpg"
    assert (item.uri, item.sha256) == (f"s3://{s3.bucket}/{key}", sha256)
    async with s3.client() as client:
        got = await client.get_object(Bucket=s3.bucket, Key=key)
        async with got["Body"] as body:
            assert await body.read() == data
    assert got["Metadata"] == {"sha256": sha256}


# --- refused, with one line ----------------------------------------------------------------------


async def refused(tmp_path: Path, graph: dict[str, Any], specs: list[str], cloud: bool) -> str:
    with pytest.raises(ConfigError) as exc:
        await prepare_inputs(local(tmp_path), job(), graph, specs, cloud)
    message = str(exc.value)
    assert "\n" not in message and exc.value.__cause__ is None
    assert not (tmp_path / "outputs").exists()  # nothing stored for a refused submit
    return message


async def test_a_bare_path_with_two_loaders_is_refused_naming_both(tmp_path: Path):
    start = write(tmp_path, "start.png", png(640, 480))
    message = await refused(tmp_path, TWO_LOADERS, [start], cloud=False)
    assert "2 image loaders (1 (LoadImage), 5 (LoadImage))" in message
    assert f"--input 1={start}" in message


async def test_a_node_that_is_no_loader_or_not_there_is_refused(tmp_path: Path):
    start = write(tmp_path, "start.png", png(640, 480))
    message = await refused(tmp_path, ONE_LOADER, [f"2={start}"], cloud=False)
    assert "node 2 is a SaveVideo, not an image loader (LoadImage)" in message
    assert "image loaders in the graph: 1 (LoadImage)" in message
    message = await refused(tmp_path, ONE_LOADER, [f"9={start}"], cloud=False)
    assert "node 9 is not in the graph" in message
    message = await refused(tmp_path, {"2": SAVE}, [start], cloud=False)
    assert "no image loader" in message


async def test_a_first_frame_too_small_for_the_cloud_is_refused_but_fine_for_comfyui(
    tmp_path: Path,
):
    tiny = write(tmp_path, "tiny.png", png(10, 10))
    message = await refused(tmp_path, ONE_LOADER, [tiny], cloud=True)
    assert message == (f"{tiny} is 10x10 px: MiniMax's first frame needs a short side over 300 px")
    assert await prepare_inputs(local(tmp_path), job(), ONE_LOADER, [tiny], cloud=False)
    # Only the first image becomes MiniMax's first frame.
    start = write(tmp_path, "start.png", png(640, 480))
    specs = [f"1={start}", f"5={tiny}"]
    assert len(await prepare_inputs(local(tmp_path), job(), TWO_LOADERS, specs, cloud=True)) == 2


async def test_an_8_to_1_first_frame_is_refused_for_the_cloud(tmp_path: Path):
    wide = write(tmp_path, "wide.jpg", jpeg(2800, 350))
    message = await refused(tmp_path, ONE_LOADER, [wide], cloud=True)
    assert "2800x350 px (aspect ratio 8.00)" in message and "between 2:5 and 5:2" in message
    tall_ok = write(tmp_path, "tall.jpg", jpeg(400, 1000))  # exactly 2:5 is accepted
    assert await prepare_inputs(local(tmp_path), job(), ONE_LOADER, [tall_ok], cloud=True)


async def test_a_gif_something_else_a_missing_file_and_a_node_twice_are_refused(tmp_path: Path):
    animated = write(tmp_path, "start.gif", gif(640, 480))
    assert "is a GIF: inputs must be JPG, PNG or WebP" in await refused(
        tmp_path, ONE_LOADER, [animated], cloud=False
    )
    text = write(tmp_path, "notes.png", b"not an image at all")
    assert "not a JPG, PNG or WebP image" in await refused(
        tmp_path, ONE_LOADER, [text], cloud=False
    )
    missing = str(tmp_path / "missing.png")
    assert f"cannot read input {missing}: No such file" in await refused(
        tmp_path, ONE_LOADER, [missing], cloud=False
    )
    start = write(tmp_path, "start.png", png(640, 480))
    assert "names node 1 more than once" in await refused(
        tmp_path, TWO_LOADERS, [f"1={start}", f"1={start}"], cloud=False
    )


# --- image headers and the graph -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "info"),
    [
        (png(640, 480), ImageInfo("png", 640, 480)),
        (jpeg(1920, 1080), ImageInfo("jpeg", 1920, 1080)),
        (jpeg(720, 1280, progressive=True), ImageInfo("jpeg", 720, 1280)),
        (webp(800, 600), ImageInfo("webp", 800, 600)),
        (webp(4000, 16, "VP8L"), ImageInfo("webp", 4000, 16)),
        (webp(16383, 301, "VP8X"), ImageInfo("webp", 16383, 301)),
        (gif(10, 20), ImageInfo("gif", 10, 20)),
        (png(640, 480)[:20], ImageInfo("png")),  # cut short: the size is unknown
        (b"<html>not an image</html>", None),
    ],
)
def test_format_and_size_are_read_off_the_header(data: bytes, info: ImageInfo | None):
    assert sniff(data) == info


def test_with_inputs_points_each_loader_at_its_upload_and_leaves_the_graph_alone():
    uploaded = {"1": "spillway/ab12.png", "5": "spillway/cd34.jpg"}
    graph = with_inputs(TWO_LOADERS, uploaded)
    assert graph["1"]["inputs"] == {"image": "spillway/ab12.png"}
    assert graph["5"]["inputs"] == {"image": "spillway/cd34.jpg"}
    assert graph["2"] is TWO_LOADERS["2"]
    assert TWO_LOADERS["1"]["inputs"] == {"image": "example.png"}  # not changed in place
    with pytest.raises(ValueError, match="node 2 is not an image loader"):
        with_inputs(TWO_LOADERS, {"2": "spillway/ab12.png"})
