"""The connection to one Redis: the first-use check, and every command sent
through the pipelined transport (``_pipe``) or redis-py's pool, with errors
translated (``_errors``).

:class:`RedisConnection` is the only place where commands are sent; the
client is built by ``_client``, the scripts loaded by ``_scripts``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, ResponseError

from ..._errors import ConfigurationError
from ._client import client_settings
from ._errors import DriverErrors
from ._keys import _SLOT_TAGS, _slot_tags
from ._pipe import Pipe, pack
from ._scripts import Script

__all__ = ["RedisConnection", "RedisFields", "RedisParts"]

logger = logging.getLogger("tenure.redis")

_EVICTING_POLICIES_OK = {"noeviction"}


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class RedisConnection:
    """How the backend talks to one Redis: every command goes through here.

    Lease commands share one pipelined connection (RESP2; an injected RESP3
    client uses its pool like the stream commands). Stream commands use
    redis-py's pool, at most ``max_concurrency`` at once (blocking reads
    aside). Before the first command, ``maxmemory-policy`` is read once: a
    policy that can evict leases is logged, or with ``strict`` every later
    command raises :class:`ConfigurationError`. Every driver error raises
    :class:`BackendUnavailable` (the outcome of the command is then unknown);
    the password is never shown.
    """

    def __init__(self, client: Any, *, strict: bool, max_concurrency: int) -> None:
        kwargs = client_settings(client)
        self.client = client
        # redis-py leaves execute_command untyped; this also saves a lookup per call.
        self._execute = cast(Callable[..., Awaitable[Any]], client.execute_command)
        #: A ``redis.asyncio.RedisCluster``: commands are routed by key slot.
        self.cluster = isinstance(client, RedisCluster)
        pool: Any = getattr(client, "connection_pool", None)
        self._sentinel: Any = getattr(pool, "sentinel_manager", None)
        self._listen_client: aioredis.Redis | None = None
        #: The database number (0 on a cluster).
        self.db = int(kwargs.get("db") or 0)
        if self.cluster:
            nodes = client.nodes_manager.startup_nodes.values()
            seen = ",".join(f"{n.host}:{n.port}" for n in nodes)
            self.where = f"cluster via {seen}"
        elif self._sentinel is not None:  # a Sentinel-managed client
            seen = ",".join(
                f"{c.connection_pool.connection_kwargs.get('host')}:"
                f"{c.connection_pool.connection_kwargs.get('port')}"
                for c in self._sentinel.sentinels
            )
            self.where = f"sentinel {pool.service_name!r} via {seen}/{kwargs.get('db', 0)}"
        elif "path" in kwargs:
            self.where = f"unix:{kwargs['path']}/{kwargs.get('db', 0)}"
        else:
            self.where = (
                f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
                f"/{kwargs.get('db', 0)}"
            )
        secrets = [kwargs.get("password"), kwargs.get("ssl_password")]
        self.driver_errors = DriverErrors(self.where, [s for s in secrets if isinstance(s, str)])
        # Bounds the commands in flight (so the connections), instead of redis-py's
        # pool failing with "Too many connections" under a burst.
        self.slots = asyncio.Semaphore(max_concurrency)
        self.pipe: Pipe | None = None
        if not self.cluster and str(kwargs.get("protocol") or 2) == "2":
            self.pipe = Pipe(client.connection_pool, kwargs.get("socket_timeout"))
        self._strict = strict
        #: Read at first use: the server may evict keys (``maxmemory-policy``).
        self.evicting = False
        #: Read at first use: ``appendonly yes`` with ``appendfsync always``
        #: (``False`` when ``CONFIG`` cannot be read).
        self.durable = False
        #: The first-use check passed: commands may be sent.
        self.ready = False
        self.config_error: ConfigurationError | None = None
        self._prepare_lock = asyncio.Lock()

    async def prepare(self) -> None:
        """Read ``maxmemory-policy`` and the persistence settings once; raise the
        strict refusal, if any."""
        async with self._prepare_lock:
            if not self.ready and self.config_error is None:
                task = asyncio.current_task()
                cancels = 0 if task is None else task.cancelling()
                # On a cluster: every primary's answer; the worst one counts.
                target = {"target_nodes": RedisCluster.PRIMARIES} if self.cluster else {}
                with self.driver_errors:
                    infos = await self.client.info("memory", **target)
                    try:
                        configs = await self.client.config_get("append*", **target)
                    except ResponseError:  # CONFIG renamed or refused (managed services)
                        configs = {}
                if task is not None and task.cancelling() > cancels:
                    raise asyncio.CancelledError  # lost by redis-py: see ``io``
                if not self.cluster:
                    infos, configs = {"": infos}, {"": configs}
                durable = [
                    {_text(k): _text(v) for k, v in config.items()} for config in configs.values()
                ]
                self.durable = bool(durable) and all(
                    d.get("appendonly") == "yes" and d.get("appendfsync") == "always"
                    for d in durable
                )
                policies = {str(i.get("maxmemory_policy", "unknown")) for i in infos.values()}
                evicting = sorted(policies - _EVICTING_POLICIES_OK)
                policy = ", ".join(evicting)
                self.evicting = bool(evicting)
                if self.evicting:
                    message = (
                        f"Redis at {self.where} has maxmemory-policy {policy!r}: it can evict "
                        "live leases and stream entries; set maxmemory-policy noeviction"
                    )
                    if self._strict:
                        self.config_error = ConfigurationError(message)
                    else:
                        logger.warning("%s", message)
                await self.prepare_cluster()
                self.ready = self.config_error is None
        if self.config_error is not None:
            raise self.config_error

    async def call(self, *args: Any) -> Any:
        """One command, on the lease connection."""
        if not self.ready:
            await self.prepare()
        with self.driver_errors:
            if self.pipe is not None:
                return await self.pipe.execute(*args)
            async with self.slots:
                return await self._execute(*args)

    async def eval(self, script: Script, keys: Sequence[bytes], args: Sequence[Any]) -> Any:
        """Run ``script`` once, on the lease connection.

        Never re-sent, except as ``EVAL`` after ``NOSCRIPT`` (the script cache
        was flushed), which means it did not run.
        """
        if not self.ready:
            await self.prepare()
        with self.driver_errors:
            if self.pipe is not None:
                execute = self.pipe.execute
                try:
                    return await execute("EVALSHA", script.sha, len(keys), *keys, *args)
                except NoScriptError:
                    return await execute("EVAL", script.body, len(keys), *keys, *args)
            async with self.slots:
                try:
                    return await self._execute("EVALSHA", script.sha, len(keys), *keys, *args)
                except NoScriptError:
                    return await self._execute("EVAL", script.body, len(keys), *keys, *args)

    async def eval_per_key(
        self, script: Script, keys: Sequence[bytes], args: Sequence[bytes | int]
    ) -> list[Any]:
        """Run a one-key ``script`` once per key with the same ``args``, all
        written at once (not a transaction); the replies in order.

        The scripts that got ``NOSCRIPT`` (and therefore did not run) are
        re-sent once as ``EVAL``.
        """
        return await self.eval_each(script, keys, [args] * len(keys))

    async def eval_each(
        self,
        script: Script,
        keys: Sequence[bytes],
        args: Sequence[Sequence[bytes | int]],
    ) -> list[Any]:
        """:meth:`eval_per_key` with each key's own ``args`` (``args[i]`` for ``keys[i]``)."""
        if not self.ready:
            await self.prepare()
        results: list[Any] = [None] * len(keys)
        todo = list(range(len(keys)))
        command, body = "EVALSHA", script.sha.encode()
        tails: dict[int, bytes] = {}
        with self.driver_errors:
            for _ in range(2):
                if self.pipe is not None:
                    head = pack((command, body, 1))[4:]
                    packed = []
                    for i in todo:
                        # Commands that share their args share one packing of them.
                        tail = tails.get(id(args[i]))
                        if tail is None:
                            tail = pack(args[i])
                            tail = tails[id(args[i])] = tail[tail.index(b"\n") + 1 :]
                        packed.append(
                            b"*%d\r\n%b$%d\r\n%b\r\n%b"
                            % (4 + len(args[i]), head, len(keys[i]), keys[i], tail)
                        )
                    replies = await self.pipe.execute_many(packed)
                else:
                    async with self.slots, self.client.pipeline(transaction=False) as pipe:
                        for i in todo:
                            pipe.execute_command(command, body, 1, keys[i], *args[i])
                        replies = await pipe.execute(raise_on_error=False)
                missing = []
                for i, reply in zip(todo, replies, strict=True):
                    if isinstance(reply, NoScriptError):
                        missing.append(i)
                    elif isinstance(reply, BaseException):
                        raise reply
                    else:
                        results[i] = reply
                if not missing:
                    break
                # Those got NOSCRIPT, so they did not run: sending the body is safe.
                todo, command, body = missing, "EVAL", script.body
                tails.clear()
        return results

    async def io(
        self,
        method: Callable[..., Awaitable[Any]],
        *args: Any,
        blocking: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Run ``method(*args, **kwargs)`` (a redis-py client method) with the
        first-use check and error translation.

        ``blocking`` calls (a reader's ``XREADGROUP … BLOCK``) hold their
        connection for long, so they do not take one of the command slots.

        A cancellation of the calling task that redis-py lost is raised once
        the call has returned: redis-py sends each command inside
        ``asyncio.wait_for``, which on Python 3.11 drops a cancellation that
        arrives just as the send completes, and then carries on reading the
        reply (for ``XREADGROUP … BLOCK``, for up to ``block_ms``). Without
        this a cancelled reader could go on reading, and taking entries, for
        ever.
        """
        task = asyncio.current_task()
        cancels = 0 if task is None else task.cancelling()
        if not self.ready:
            await self.prepare()
        with self.driver_errors:
            if blocking:
                result = await method(*args, **kwargs)
            else:
                async with self.slots:
                    result = await method(*args, **kwargs)
        if task is not None and task.cancelling() > cancels:
            raise asyncio.CancelledError
        return result

    async def aclose(self, *, close_client: bool) -> None:
        if self.pipe is not None:
            await self.pipe.aclose()
        if close_client:
            with contextlib.suppress(Exception):
                await self.client.aclose()
            if self._sentinel is not None:  # its connections to the sentinels
                with contextlib.suppress(Exception):
                    await self._sentinel.aclose()
        if self._listen_client is not None:
            with contextlib.suppress(Exception):
                await self._listen_client.aclose()

    def pubsub(self) -> Any:
        """A redis-py ``PubSub`` for release wake-ups.

        On a cluster, on a plain connection to one primary: ``PUBLISH`` reaches
        every node of a cluster, so any node hears every release.
        """
        if not self.cluster:
            return self.client.pubsub()
        if self._listen_client is None:
            node = self.client.get_default_node()
            kwargs = client_settings(self.client)
            keep = ("username", "password", "socket_timeout", "socket_connect_timeout", "ssl")
            self._listen_client = aioredis.Redis(
                host=node.host,
                port=node.port,
                retry=Retry(NoBackoff(), 0),
                **{k: kwargs[k] for k in keep if kwargs.get(k) is not None},
            )
        return self._listen_client.pubsub()

    async def scan_targets(self) -> list[dict[str, Any]]:
        """Keyword arguments that send a ``SCAN`` to each node holding keys."""
        if not self.cluster:
            return [{}]
        if not self.ready:
            await self.prepare()
        return [{"target_nodes": node} for node in self.client.get_primaries()]

    async def prepare_cluster(self) -> None:
        """Build the slot tags (:func:`slot_tag`) off the event loop, once."""
        if self.cluster and not _SLOT_TAGS:
            await asyncio.to_thread(_slot_tags)


class RedisFields:
    """The names the lease half and the event half share, declared once: the
    connection, the key prefix and the instance's name. :class:`RedisParts` sets
    them up; the lease half reads them."""

    _conn: RedisConnection
    _client: Any
    _eval: Callable[[Script, Sequence[bytes], Sequence[Any]], Awaitable[Any]]
    _call: Callable[..., Awaitable[Any]]
    _io: Callable[..., Awaitable[Any]]
    _where: str
    _prefix: str
    _p: bytes
    _instance: str


class RedisParts(RedisFields):
    """What the lease half and the event half share, set up once per backend."""

    def _setup_connection(
        self, client: Any, *, prefix: str, strict: bool, max_concurrency: int
    ) -> None:
        conn = RedisConnection(client, strict=strict, max_concurrency=max_concurrency)
        self._conn = conn
        self._client = client
        # Bound once: the lease operations' hot path saves the lookups.
        self._eval = conn.eval
        self._call = conn.call
        self._io = conn.io
        self._where = conn.where
        self._prefix = prefix
        self._p = prefix.encode("utf-8")
        self._instance = uuid.uuid4().hex[:12]
