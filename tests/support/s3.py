"""A real S3-compatible server for tests: moto's ThreadedMotoServer on 127.0.0.1 (a free port),
speaking S3 over HTTP to the same aiobotocore client the worker uses. Nothing is mocked inside
the client and nothing is downloaded.

Loaded by conftest: the `s3` fixture, a fresh bucket on the session's server; outside pytest
(the benchmark), `with moto_server() as url: ...`. moto and aiobotocore are imported only when
used, so the other tests do not pay for them.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from spillway.core.settings import Settings

if TYPE_CHECKING:
    from types_aiobotocore_s3 import S3Client

# Distinctive values, so a test can prove they appear in no error text or log line.
ACCESS_KEY_ID = "AKIASPILLWAYCANARY42"
SECRET_ACCESS_KEY = "spillway-canary-secret-9f3e7c1d5b"
REGION = "us-east-1"


@contextmanager
def moto_server() -> Iterator[str]:
    """moto's S3 in a thread of this process, on 127.0.0.1; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one access-log line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@dataclass(frozen=True)
class S3Endpoint:
    url: str
    bucket: str
    access_key_id: str = ACCESS_KEY_ID
    secret_access_key: str = SECRET_ACCESS_KEY

    def env(self, prefix: str = "outputs") -> dict[str, str]:
        """The variables a worker would be given to store its outputs here."""
        return {
            "SPILLWAY_OUTPUT_URL": f"s3://{self.bucket}/{prefix}".rstrip("/"),
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            "AWS_REGION": REGION,
            "AWS_ENDPOINT_URL": self.url,
        }

    def settings(self, prefix: str = "outputs", **overrides: Any) -> Settings:
        """Settings that store outputs here; `overrides` are further settings (env names)."""
        return Settings(**(self.env(prefix) | overrides))

    def client(self) -> AbstractAsyncContextManager[S3Client]:
        """A separate client, for looking at what the server holds."""
        from aiobotocore.session import get_session

        return get_session().create_client(
            "s3",
            region_name=REGION,
            endpoint_url=self.url,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
        )


@pytest.fixture(scope="session")
def moto_url() -> Iterator[str]:
    with moto_server() as url:
        yield url


@pytest.fixture
async def s3(moto_url: str) -> AsyncIterator[S3Endpoint]:
    """The moto server with a new, empty bucket (moto's state is shared by the session)."""
    endpoint = S3Endpoint(url=moto_url, bucket=f"spillway-{uuid.uuid4().hex[:12]}")
    async with endpoint.client() as client:
        await client.create_bucket(Bucket=endpoint.bucket)
    yield endpoint
