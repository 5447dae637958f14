"""An HTTP client for a URL a client named, which connects only to the addresses
spillway.core.addresses checked (docs/design.md, "Clients, inputs and outputs"). httpx would resolve
the name again when it connects, and an answer that changed since the check (DNS rebinding)
would take the request where the check never looked. Here the connection goes to a checked
address while TLS (server name, certificate) and the Host header keep the URL's name.

httpx's own transport takes no network backend, so this one wraps httpcore's pool as
httpx.AsyncHTTPTransport does. It never goes through HTTP(S)_PROXY (a proxy resolves the name
itself) nor sends .netrc credentials to a host a client chose.
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager

import httpcore
import httpx

from spillway.core.addresses import Checked

# httpcore raises its own errors; callers catch httpx's, which bear the same names. The more
# specific first.
_ERRORS: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
)


@contextmanager
def _as_httpx_errors() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        for theirs, ours in _ERRORS:
            if isinstance(exc, theirs):
                raise ours(str(exc)) from exc
        raise


class _CheckedAddresses(httpcore.AsyncNetworkBackend):
    def __init__(self, checked: Checked) -> None:
        self._checked, self._backend = checked, httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 -- httpcore's interface
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        if (host, port) != (self._checked.host, self._checked.port):
            # One client per checked URL, redirects not followed: any other origin was never
            # checked.
            raise httpcore.ConnectError(f"{host}:{port} was not checked")
        failed: Exception = httpcore.ConnectError("no address")
        for address in self._checked.addresses:
            try:
                return await self._backend.connect_tcp(
                    address, port, timeout, local_address, socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failed = exc
        raise failed

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


class _Body(httpx.AsyncByteStream):
    def __init__(self, stream: Iterable[bytes] | AsyncIterable[bytes]) -> None:
        assert isinstance(stream, AsyncIterable)  # an async pool answers with async streams
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _as_httpx_errors():
            async for part in self._stream:
                yield part

    async def aclose(self) -> None:
        close = getattr(self._stream, "aclose", None)  # the pool's stream: returns the connection
        if close is not None:
            await close()


class _Transport(httpx.AsyncBaseTransport):
    def __init__(self, checked: Checked) -> None:
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=_ssl_context(), network_backend=_CheckedAddresses(checked)
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        core = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with _as_httpx_errors():
            answer = await self._pool.handle_async_request(core)
        return httpx.Response(
            status_code=answer.status,
            headers=answer.headers,
            stream=_Body(answer.stream),
            extensions=answer.extensions,
        )

    async def aclose(self) -> None:
        await self._pool.aclose()


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    return httpx.create_ssl_context()


@asynccontextmanager
async def client(
    checked: Checked | None, shared: httpx.AsyncClient
) -> AsyncIterator[httpx.AsyncClient]:
    """The client to reach a URL with: `shared` for one that was not resolved by the check (the
    workers' own URL, `checked` None, or a listed host); otherwise one of its own that connects
    only to `checked.addresses`, closed on exit."""
    if checked is None or not checked.addresses:
        yield shared
        return
    async with httpx.AsyncClient(transport=_Transport(checked), trust_env=False) as pinned:
        yield pinned
