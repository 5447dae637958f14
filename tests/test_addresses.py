"""Fetch only what was meant (spillway/core/addresses.py): an input URL or a job's own callback URL
that is, or resolves to, a loopback, private or link-local address is refused at submit and
again where it would be fetched or posted, redirects included, unless its host is listed in
SPILLWAY_INPUT_ALLOW_HOSTS; the name checked is the one httpx connects to, and the connection
goes to an address the check saw, whatever the name resolves to later; what is fetched must be an
image before anything is uploaded; and no failure tells which ports answer. Real HTTP servers on
127.0.0.1 count what reaches them; made-up names resolve through a double of the system
resolver."""

from __future__ import annotations

import errno
import ipaddress
import re
import socket
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest
from aiohttp import web

from activities import pinned
from activities.callbacks import (
    CALLBACK_BAD_URL,
    CALLBACK_UNREACHABLE,
    CallbackActivities,
    CallbackDelivery,
    JobEvent,
)
from activities.inputs import InputUnreadable, read_input
from activities.storage.local import LocalOutputStore
from spillway.client import jobs
from spillway.core.addresses import Checked, Refused, allow_list, check
from spillway.core.errors import ConfigError
from spillway.core.models import JobInput, VideoJob
from spillway.core.settings import Settings
from tests.support.activity import run_activity
from tests.support.cli import free_ports
from tests.support.graphs import VIDEO_GRAPH
from tests.support.images import png

NOBODY: frozenset[str] = frozenset()  # the rule as shipped: SPILLWAY_INPUT_ALLOW_HOSTS unset
IMAGE = png(640, 480)
PUBLIC = "8.8.8.8"  # global to the check; Network refuses it, nothing is sent


class Server:
    """A file server on 127.0.0.1: `/image.png`, `/text`, `/forbidden` (403), `/to?url=...`
    (a 302 there); `hits` counts every request by path."""

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        self.hosts: list[str] = []  # each request's Host header
        self.port = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.hits[request.path] += 1
        self.hosts.append(request.host)
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


class Resolver:
    """socket.getaddrinfo, which the check (through asyncio) and httpx (through anyio) both call,
    with made-up names: a name answers its addresses in turn, one per lookup, the last one from
    then on; other names go to the real resolver. A name passed as text is encoded the way the
    socket module does before it asks the system: Python's IDNA 2003 codec (straße: strasse)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, names: dict[str, list[str]]) -> None:
        self.names, self.asked = names, list[str]()
        self._real = socket.getaddrinfo
        monkeypatch.setattr(socket, "getaddrinfo", self)

    def __call__(self, host: Any, port: Any, *args: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else str(host).encode("idna").decode()
        if name not in self.names:
            return self._real(host, port, *args)
        self.asked.append(name)
        answers = self.names[name]
        address = answers[min(self.asked.count(name), len(answers)) - 1]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]


class Network:
    """anyio.connect_tcp, which every httpx connection goes through, recording where it was
    asked to connect: an IP address other than loopback fails at once, as an unreachable one
    would (nothing leaves the machine); loopback and names connect as usual."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tried = list[str]()
        self._real = anyio.connect_tcp
        monkeypatch.setattr(anyio, "connect_tcp", self.connect)

    async def connect(self, remote_host: str, remote_port: int, **options: Any) -> Any:
        self.tried.append(remote_host)
        try:
            unreachable = not ipaddress.ip_address(remote_host).is_loopback
        except ValueError:
            unreachable = False
        if unreachable:
            raise OSError(errno.ENETUNREACH, "no network in a test")
        return await self._real(remote_host, remote_port, **options)


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
        # A status as a word: the random ports may hold the digits (34037).
        assert not re.search(r"\b403\b", text), text
        for telling in ("Connect", "refused", "token", "pw@"):
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


# --- the name httpx connects to, and the address it connects to -------------------------------


async def test_a_name_is_resolved_in_the_idna_2008_form_httpx_connects_to(
    server: Server, tmp_path, monkeypatch: pytest.MonkeyPatch
):
    # straße.example is strasse.example in IDNA 2003 and xn--strae-oqa.example in IDNA 2008,
    # which httpx uses: two names, which may point anywhere.
    resolver = Resolver(
        monkeypatch, {"strasse.example": [PUBLIC], "xn--strae-oqa.example": ["127.0.0.1"]}
    )
    network = Network(monkeypatch)
    url = server.url("/image.png", "straße.example")
    result = await fetch(url, NOBODY, tmp_path)
    assert isinstance(result, InputUnreadable) and not result.retryable
    assert "refused: xn--strae-oqa.example is not allowed" in str(result)
    assert network.tried == []
    # The other way round, the name httpx reaches is global: fetched from there only.
    resolver.names = {"strasse.example": ["127.0.0.1"], "xn--strae-oqa.example": [PUBLIC]}
    result = await fetch(url, NOBODY, tmp_path)
    assert isinstance(result, InputUnreadable) and result.retryable
    assert "could not fetch" in str(result)
    assert network.tried == [PUBLIC]
    assert "strasse.example" not in resolver.asked
    assert sum(server.hits.values()) == 0


async def test_a_name_that_resolves_to_loopback_after_the_check_is_never_connected_to(
    server: Server, tmp_path, monkeypatch: pytest.MonkeyPatch
):
    # Global for the check, loopback for every lookup after it (DNS rebinding).
    resolver = Resolver(monkeypatch, {"rebind.example": [PUBLIC, "127.0.0.1"]})
    network = Network(monkeypatch)
    result = await fetch(server.url("/image.png", "rebind.example"), NOBODY, tmp_path)
    assert isinstance(result, InputUnreadable) and result.retryable
    assert "could not fetch" in str(result)
    assert network.tried == [PUBLIC]
    delivery = CallbackDelivery(
        url=server.url("/hook", "rebind.example"),
        delivery_id="job-1:run:job.completed",
        event=JobEvent(event="job.completed", job_id="job-1", plan={}),
    )
    resolver.asked.clear()
    async with httpx.AsyncClient() as http:
        acts = CallbackActivities(http, Settings(SPILLWAY_INPUT_ALLOW_HOSTS=""))
        result, _ = await run_activity(acts.job_callback, delivery)
    assert getattr(result, "type", None) == CALLBACK_UNREACHABLE
    assert resolver.asked == ["rebind.example"]  # once: by the check
    assert network.tried == [PUBLIC, PUBLIC]
    assert sum(server.hits.values()) == 0


async def test_a_checked_url_is_reached_at_the_checked_address_under_its_own_name(
    server: Server,
):
    checked = Checked("images.example", server.port, ("127.0.0.1",))
    async with httpx.AsyncClient() as shared, pinned.client(checked, shared) as http:
        answer = await http.get(server.url("/image.png", "images.example"))
        assert answer.content == IMAGE
        assert server.hosts == [f"images.example:{server.port}"]
        with pytest.raises(httpx.ConnectError, match="not checked"):
            await http.get(server.url("/image.png", "other.example"))
    assert server.hits["/image.png"] == 1
