"""Fetch only what was meant (spillway/addresses.py): an input URL or a job's own callback URL
that is, or resolves to, a loopback, private or link-local address is refused at submit and
again where it would be fetched or posted, redirects included, unless its host is listed in
SPILLWAY_INPUT_ALLOW_HOSTS; what is fetched must be an image before anything is uploaded; and no
failure tells which ports answer. Real HTTP servers on 127.0.0.1 count what reaches them."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from aiohttp import web

from activities.callbacks import CALLBACK_BAD_URL, CallbackActivities, CallbackDelivery, JobEvent
from activities.inputs import InputUnreadable, read_input
from activities.storage.local import LocalOutputStore
from spillway.addresses import Refused, allow_list, check
from spillway.client import jobs
from spillway.errors import ConfigError
from spillway.models import JobInput, VideoJob
from spillway.settings import Settings
from tests.support.activity import run_activity
from tests.support.cli import free_ports
from tests.support.graphs import VIDEO_GRAPH
from tests.support.images import png

NOBODY: frozenset[str] = frozenset()  # the rule as shipped: SPILLWAY_INPUT_ALLOW_HOSTS unset
IMAGE = png(640, 480)


class Server:
    """A file server on 127.0.0.1: `/image.png`, `/text`, `/forbidden` (403), `/to?url=...`
    (a 302 there); `hits` counts every request by path."""

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        self.port = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.hits[request.path] += 1
        if request.path == "/image.png":
            return web.Response(body=IMAGE, content_type="image/png")
        if request.path == "/text":
            return web.Response(text='{"AccessKeyId": "not an image"}')
        if request.path == "/to":
            raise web.HTTPFound(request.query["url"])
        if request.path == "/hook":
            return web.Response()
        return web.Response(status=403)

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    served = Server()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", served.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    served.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield served
    await runner.cleanup()


async def fetch(url: str, allow: frozenset[str], tmp_path: Any) -> bytes | InputUnreadable:
    async with httpx.AsyncClient() as http:
        try:
            item = JobInput(node="1", uri=url)
            return await read_input(LocalOutputStore(tmp_path), http, item, allow=allow)
        except InputUnreadable as exc:
            return exc


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/latest/meta-data/",
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
        "http://10.0.0.1/image.png",
        "http://192.168.1.20/image.png",
        "http://[::1]/image.png",
        "http://[::ffff:127.0.0.1]/image.png",
        # IPv6 forms that deliver to an internal IPv4 address: NAT64 (well-known and local
        # prefixes), IPv4-compatible, 6to4 and Teredo (its client).
        "http://[64:ff9b::a00:5]/image.png",
        "http://[64:ff9b:1::a9fe:a9fe]/image.png",
        "http://[::127.0.0.1]/image.png",
        "http://[2002:7f00:1::]/image.png",
        "http://[2001:0:4136:e378:8000:63bf:f5ff:fffe]/image.png",
        "http://localhost/image.png",  # a name that resolves to loopback
        "ftp://images.example.com/image.png",
    ],
)
async def test_internal_addresses_are_refused_before_any_connection(url: str):
    with pytest.raises(Refused, match="refused"):
        await check(url, NOBODY)


async def test_a_global_address_and_a_listed_host_pass():
    await check("https://8.8.8.8/image.png", NOBODY)
    await check("https://[64:ff9b::808:808]/image.png", NOBODY)  # NAT64 of a global address
    await check("http://10.0.0.1/image.png", allow_list(" files.studio.lan , 10.0.0.1"))
    await check("http://files.studio.lan/image.png", allow_list("files.studio.lan"))


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_an_input_on_loopback_is_refused_and_the_server_gets_no_request(
    server: Server, tmp_path, host: str
):
    result = await fetch(server.url("/image.png", host), NOBODY, tmp_path)
    assert isinstance(result, InputUnreadable) and not result.retryable
    assert f"refused: {host} is not allowed" in str(result)
    assert "SPILLWAY_INPUT_ALLOW_HOSTS" in str(result)
    assert sum(server.hits.values()) == 0


async def test_a_listed_host_is_fetched(server: Server, tmp_path):
    assert await fetch(server.url("/image.png"), allow_list("127.0.0.1"), tmp_path) == IMAGE
    assert server.hits["/image.png"] == 1


async def test_a_redirect_to_loopback_is_refused_and_never_followed(server: Server, tmp_path):
    target = server.url("/image.png", "localhost")
    result = await fetch(server.url(f"/to?url={target}"), allow_list("127.0.0.1"), tmp_path)
    assert isinstance(result, InputUnreadable)
    assert "refused: localhost is not allowed" in str(result)
    assert (server.hits["/to"], server.hits["/image.png"]) == (1, 0)


async def test_a_redirect_between_allowed_addresses_is_followed(server: Server, tmp_path):
    target = server.url("/image.png")
    got = await fetch(server.url(f"/to?url={target}"), allow_list("127.0.0.1"), tmp_path)
    assert got == IMAGE


async def test_an_answer_that_is_not_an_image_is_refused_before_anything_is_uploaded(
    server: Server, tmp_path
):
    result = await fetch(server.url("/text"), allow_list("127.0.0.1"), tmp_path)
    assert isinstance(result, InputUnreadable) and not result.retryable
    assert "is not a JPEG, PNG, WEBP image: nothing was uploaded" in str(result)
    assert "AccessKeyId" not in str(result)


async def test_a_refusal_and_a_closed_port_read_alike(server: Server, tmp_path):
    [closed] = free_ports(1)
    allowed = allow_list("127.0.0.1")
    texts = [
        str(await fetch(server.url("/forbidden?token=abc"), allowed, tmp_path)),
        str(await fetch(f"http://ops:pw@127.0.0.1:{closed}/x.png", allowed, tmp_path)),
    ]
    for text in texts:
        assert "could not fetch http://127.0.0.1:" in text
        for telling in ("403", "Connect", "refused", "token", "pw@"):
            assert telling not in text


async def test_a_job_with_an_internal_input_or_callback_url_is_refused_at_submit():
    settings = Settings(SPILLWAY_INPUT_ALLOW_HOSTS="")
    inputs = [JobInput(node="9", uri="http://169.254.169.254/latest/meta-data/")]
    graph = VIDEO_GRAPH | {"9": {"class_type": "LoadImage", "inputs": {"image": "x.png"}}}
    job = VideoJob(job_id="job-1", graph=graph, cloud=None, inputs=inputs)
    with pytest.raises(ConfigError, match=r"--input 9: refused: 169.254.169.254 is not allowed"):
        await jobs.check_addresses(job, settings)
    job = VideoJob(
        job_id="job-1", graph=VIDEO_GRAPH, cloud=None, callback_url="http://10.0.0.1/hook"
    )
    with pytest.raises(ConfigError, match=r"--callback-url: refused: 10.0.0.1 is not allowed"):
        await jobs.check_addresses(job, settings)
    await jobs.check_addresses(job, Settings(SPILLWAY_INPUT_ALLOW_HOSTS="10.0.0.1"))


async def test_a_jobs_callback_url_on_loopback_is_not_posted(server: Server):
    delivery = CallbackDelivery(
        url=server.url("/hook"),
        delivery_id="job-1:run:job.completed",
        event=JobEvent(event="job.completed", job_id="job-1", plan={}),
    )
    async with httpx.AsyncClient() as http:
        refusing = CallbackActivities(http, Settings(SPILLWAY_INPUT_ALLOW_HOSTS=""))
        result, _ = await run_activity(refusing.job_callback, delivery)
        assert getattr(result, "type", None) == CALLBACK_BAD_URL and result.non_retryable
        assert "refused: 127.0.0.1 is not allowed" in str(result) and "/hook" not in str(result)
        assert server.hits["/hook"] == 0
        allowing = CallbackActivities(http, Settings(SPILLWAY_INPUT_ALLOW_HOSTS="127.0.0.1"))
        result, _ = await run_activity(allowing.job_callback, delivery)
    assert result.status_code == 200 and server.hits["/hook"] == 1
