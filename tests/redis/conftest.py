"""Fixtures for the Redis tests: a private redis-server per test, backends on it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import pytest_asyncio

from tenure._url import backend_class
from tenure.backends.redis import RedisStreamsPubSub

from ..support.redis_server import RedisServer

MakeBackend = Callable[..., RedisStreamsPubSub]


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A private, empty redis-server (no persistence) that the test may kill or restart."""
    with RedisServer() as srv:
        yield srv


@pytest_asyncio.fixture
async def make_backend() -> AsyncIterator[MakeBackend]:
    """``make_backend(url, **options)``: a backend that is closed at the end of the test."""
    made: list[RedisStreamsPubSub] = []

    def make(url: str, **options: Any) -> RedisStreamsPubSub:
        options.setdefault("socket_timeout", 2.0)
        options.setdefault("socket_connect_timeout", 2.0)
        # The class of the URL's scheme: RedisClusterPubSub for redis+cluster://.
        backend: RedisStreamsPubSub = backend_class(url).from_url(url, **options)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        await backend.aclose()
