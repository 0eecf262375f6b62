"""The connection to one Redis: building the client, the pipelined lease
connection, the first-use check, and the one translation of driver errors.

:class:`RedisConnection` is the only place where redis-py's errors (and the
socket's) become :class:`BackendUnavailable`, with secrets removed; both halves
of the backend send every command through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import uuid
from binascii import crc_hqx
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from types import TracebackType
from typing import Any, cast
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.connection import URL_QUERY_ARGUMENT_PARSERS
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisClusterException, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..._errors import BackendUnavailable, ConfigurationError
from ..._url_options import parse_query, redact, redact_url, to_bool, to_int, url_secrets

__all__ = [
    "RedisConnection",
    "RedisParts",
    "Script",
    "client_from_url",
    "client_settings",
    "load_script",
    "slot_tag",
]

logger = logging.getLogger("tenure.redis")

# RedisClusterException is not a RedisError (e.g. "no targets were found").
_DRIVER_ERRORS = (RedisError, RedisClusterException, OSError)
_EVICTING_POLICIES_OK = {"noeviction"}

# -- scripts -----------------------------------------------------------------------


@dataclass(frozen=True)
class Script:
    """A Lua script shipped in ``lua/``, run with ``EVALSHA`` (``EVAL`` after ``NOSCRIPT``)."""

    name: str
    body: bytes
    sha: str


def load_script(name: str) -> Script:
    body = resources.files(__package__).joinpath("lua", f"{name}.lua").read_bytes()
    return Script(name, body, hashlib.sha1(body).hexdigest())


def _tag(name: str) -> bytes:
    """``name`` as UTF-8 with ``%``, ``{`` and ``}`` percent-escaped.

    Injective, and free of braces, so it can sit inside a hash tag (which ends
    at the first ``}``) and be told apart from the fixed suffixes after it.
    """
    raw = name.encode("utf-8")
    if b"%" in raw or b"{" in raw or b"}" in raw:
        raw = raw.replace(b"%", b"%25").replace(b"{", b"%7B").replace(b"}", b"%7D")
    return raw


def client_settings(client: Any) -> dict[str, Any]:
    """The connection settings of a ``Redis`` (its pool's) or a ``RedisCluster``."""
    if isinstance(client, RedisCluster):
        return client.connection_kwargs
    return cast(dict[str, Any], client.connection_pool.connection_kwargs)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


_SLOT_TAGS: list[bytes] = []


def _slot_tags() -> list[bytes]:
    """For each of a Redis Cluster's 16384 key slots, a short hash tag in it
    (found by counting in hex; about 0.3 s, once per process)."""
    if not _SLOT_TAGS:
        tags: list[bytes | None] = [None] * 16384
        left, i = 16384, 0
        while left:
            tag = b"%x" % i
            slot = crc_hqx(tag, 0) % 16384
            if tags[slot] is None:
                tags[slot] = tag
                left -= 1
            i += 1
        _SLOT_TAGS[:] = [t for t in tags if t is not None]
    return _SLOT_TAGS


def slot_tag(key: bytes) -> bytes:
    """A hash tag in the key slot of ``key`` (a key whose tag is ``{<key's tag>}``)."""
    return _slot_tags()[key_slot(key)]


# -- URL options ---------------------------------------------------------------------

_NO_RETRIES = (
    "tenure turns redis-py's retries off: a retried lease script could run twice "
    "(a command that failed may have run)"
)


def _no_retries(text: str) -> bool:
    if to_bool(text):
        raise ValueError(_NO_RETRIES)
    return False


def _refused(reason: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        raise ValueError(reason)

    return parse


OUR_OPTIONS: dict[str, Callable[[str], Any]] = {
    "prefix": str,
    "max_ttl_ms": to_int(1),
    "quarantine": to_bool,
    "min_replicas": to_int(0),
    "replica_wait_ms": to_int(1),
    "strict": to_bool,
    "max_attempts": to_int(1),
    "stream_maxlen": to_int(1),
    "claim_idle_ms": to_int(1),
    "dedupe_window_ms": to_int(1),
    "max_concurrency": to_int(1),
}

# What redis-py's own ``from_url`` takes from a query: the options it parses
# (read from the installed redis-py) and those it passes on as strings to the
# connection class. Passed on as written; redis-py parses them again.
THEIR_OPTIONS: dict[str, Callable[[str], Any]] = {
    **cast(dict[str, Callable[[str], Any]], URL_QUERY_ARGUMENT_PARSERS),
    **dict.fromkeys(
        [
            "password",
            "username",
            "client_name",
            "lib_name",
            "lib_version",
            "encoding",
            "encoding_errors",
            "ssl_keyfile",
            "ssl_certfile",
            "ssl_cert_reqs",
            "ssl_ca_certs",
            "ssl_ca_data",
            "ssl_ca_path",
            "ssl_ciphers",
            "ssl_password",
        ],
        str,
    ),
    "retry_on_timeout": _no_retries,
    "retry_on_error": _refused(_NO_RETRIES),
    # redis-py would pass the text on, and any text is true: replies would be str.
    "decode_responses": _refused("the backend needs decode_responses off"),
}
_RETRY_KEYWORDS = ("retry", "retry_on_timeout", "retry_on_error")
# The options the backend's constructor takes besides those of the URL.
_OUR_KEYWORDS = {*OUR_OPTIONS, "block_ms", "owns_client"}


def client_from_url(url: str, options: dict[str, Any]) -> tuple[aioredis.Redis, dict[str, Any]]:
    """The client for ``url`` (retries off) and the backend's own options.

    Query values are checked here; keyword ``options`` override them. Raises
    :class:`ConfigurationError` for an unknown or bad option, an option that
    would turn retries on, or one the connection class does not take (e.g.
    ``ssl_*`` on ``redis://``). No message shows a password.
    """
    secrets = url_secrets(url)
    shown = redact_url(url)
    try:
        query = parse_query(url, OUR_OPTIONS, theirs=THEIR_OPTIONS, what="Redis URL")
    except ConfigurationError as exc:
        # redact_url knows ``password=`` only; ``ssl_password=`` is a secret too.
        raise ConfigurationError(redact(str(exc), secrets)) from None
    parts = urlsplit(url)  # parse_query has parsed it
    scheme = parts.scheme.lower()
    if scheme not in {"redis", "rediss", SENTINEL_SCHEME, CLUSTER_SCHEME}:
        raise ConfigurationError(
            redact(
                f"not a redis://, rediss://, {SENTINEL_SCHEME}:// or {CLUSTER_SCHEME}:// URL: "
                f"{shown!r}",
                secrets,
            )
        )
    for name in _RETRY_KEYWORDS:
        if name in options:
            raise ConfigurationError(f"option {name!r} is refused: {_NO_RETRIES}")
    ours = {**query.ours, **options}
    theirs = {name: ours.pop(name) for name in list(ours) if name not in _OUR_KEYWORDS}
    # redis-py lets a query value win over a keyword; here the keyword wins.
    rest = [s for s in query.rest if unquote(s.partition("=")[0]) not in theirs]
    theirs.setdefault("socket_timeout", 5.0)
    theirs.setdefault("socket_connect_timeout", 5.0)
    # The command slots bound the connections; the pool must never refuse.
    theirs.setdefault("max_connections", 2**31)
    try:
        if scheme == SENTINEL_SCHEME:
            client = _sentinel_client(parts, rest, theirs)
        elif scheme == CLUSTER_SCHEME:
            client = _cluster_client(parts, rest, theirs)
        else:
            redis_url = urlunsplit((parts.scheme, parts.netloc, parts.path, "&".join(rest), ""))
            client = aioredis.Redis.from_url(
                redis_url, retry=Retry(NoBackoff(), 0), retry_on_timeout=False, **theirs
            )
        # Only builds a connection object: an option the connection class does
        # not take fails here rather than at first use. (RedisCluster's own
        # signature refuses unknown options.)
        if not isinstance(client, RedisCluster):
            pool: Any = client.connection_pool
            pool.make_connection()
    except (TypeError, ValueError, RedisError, RedisClusterException) as exc:
        secrets.append(str(theirs.get("password") or ""))
        raise ConfigurationError(
            redact(f"cannot use Redis URL {shown!r}: {exc}", secrets)
        ) from None
    return client, ours


SENTINEL_SCHEME = "redis+sentinel"
CLUSTER_SCHEME = "redis+cluster"


def _hosts(parts: SplitResult, what: str) -> list[tuple[str, int]]:
    """The ``host:port[,host:port…]`` of a Sentinel or Cluster URL."""
    _, _, hostlist = parts.netloc.rpartition("@")
    hosts = []
    for item in hostlist.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"{what} address {item!r} is not host:port")
        hosts.append((host.strip("[]"), int(port)))
    return hosts


def _driver_options(parts: SplitResult, query: Sequence[str], options: dict[str, Any]) -> None:
    """Add the query's driver options (parsed as redis-py parses them) and the
    user-info to ``options``; keywords already there win."""
    parsers = cast(dict[str, Callable[[str], Any]], URL_QUERY_ARGUMENT_PARSERS)
    for segment in query:
        name, _, value = segment.partition("=")
        name, value = unquote(name), unquote(value)
        options.setdefault(name, parsers.get(name, str)(value))
    if parts.username:
        options.setdefault("username", unquote(parts.username))
    if parts.password:
        options.setdefault("password", unquote(parts.password))


def _sentinel_client(parts: SplitResult, query: Sequence[str], options: dict[str, Any]) -> Any:
    """The master client of ``redis+sentinel://[[user]:password@]host:port[,host:port…]/<service>``.

    The user-info and every query option apply to the master's connections;
    the sentinels get the socket timeouts only. redis-py's Sentinel pool asks
    the sentinels for the master's address whenever a connection is made, and
    a connection that finds a demoted master (``READONLY``) is dropped, so the
    next one reaches the new master.
    """
    from redis.asyncio.sentinel import Sentinel

    service = unquote(parts.path.strip("/"))
    if not service or "/" in service:
        raise ValueError("the path must be the Sentinel service name: /<service_name>")
    sentinels = _hosts(parts, "sentinel")
    _driver_options(parts, query, options)
    sentinel_options = {k: v for k, v in options.items() if k.startswith("socket_")}
    sentinel_options["retry"] = Retry(NoBackoff(), 0)
    options.pop("max_connections", None)  # the Sentinel pool is not bounded by it
    sentinel = Sentinel(sentinels, sentinel_kwargs=sentinel_options)  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
    return sentinel.master_for(
        service, redis_class=aioredis.Redis, retry=Retry(NoBackoff(), 0), **options
    )


def _cluster_client(parts: SplitResult, query: Sequence[str], options: dict[str, Any]) -> Any:
    """The client of ``redis+cluster://[[user]:password@]host:port[,host:port…]``.

    The hosts are startup nodes; redis-py learns the rest of the cluster from
    them. Its retries are off: a connection failure is not re-sent (redirections,
    ``MOVED`` and ``ASK``, still are: a redirected command did not run).
    """
    from redis.asyncio.cluster import ClusterNode

    if parts.path.strip("/"):
        raise ValueError("a Redis Cluster has one database: no path after the hosts")
    nodes = [ClusterNode(host, port) for host, port in _hosts(parts, "cluster node")]
    _driver_options(parts, query, options)
    options.pop("retry_on_timeout", None)  # not a RedisCluster option; off anyway
    return RedisCluster(startup_nodes=nodes, retry=Retry(NoBackoff(), 0), **options)


# -- the pipelined lease connection ----------------------------------------------------


def _pack(args: Sequence[Any]) -> bytes:
    """One command in RESP (what redis-py's ``pack_command`` does, without its overhead)."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, bytes):
            data = arg
        elif isinstance(arg, str):
            data = arg.encode("utf-8")
        elif isinstance(arg, int):
            data = b"%d" % arg
        else:
            raise TypeError(f"cannot send {type(arg).__name__} to Redis")
        parts.append(b"$%d\r\n%b\r\n" % (len(data), data))
    return b"".join(parts)


class _Pipe:
    """One connection on which lease commands are pipelined.

    Commands from every task are written back to back (those issued in the
    same event-loop turn in one write) and a reader task matches replies to
    callers in order. A lone caller still gets one round trip per command;
    concurrent callers share writes and reads instead of each taking a pooled
    connection. Nothing is ever re-sent: if the connection breaks or the
    oldest reply is later than ``timeout`` seconds, every waiting call fails
    (its outcome unknown) and the next call connects again.
    """

    def __init__(self, pool: Any, timeout: float | None) -> None:
        self._pool = pool
        self._timeout = timeout
        #: Run on each new connection before any command is written to it
        #: (with the raw redis-py connection); an error fails the connect.
        self.on_connect: Callable[[Any], Awaitable[None]] | None = None
        self._conn: Any = None
        self._writer: Any = None
        self._pending: deque[tuple[asyncio.Future[Any], float]] = deque()
        self._out: list[bytes] = []
        self._flush_handle: asyncio.Handle | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._reader: asyncio.Task[None] | None = None
        self._timed_out = False
        self._lock = asyncio.Lock()

    async def execute(self, *args: Any) -> Any:
        conn = self._conn
        if conn is None:
            conn = await self._connect()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._out.append(_pack(args))
        self._pending.append((fut, loop.time()))
        if self._flush_handle is None:
            self._flush_handle = loop.call_soon(self._flush)
        if self._timer is None and self._timeout is not None:
            self._timer = loop.call_later(self._timeout, self._check_timeout)
        return await fut

    async def execute_many(self, packed: Sequence[bytes]) -> list[Any]:
        """Send commands already in RESP (see :func:`_pack`) in one write.

        Returns the replies in order, a ``ResponseError`` object in place of
        each error reply.
        """
        if self._conn is None:
            await self._connect()
        loop = asyncio.get_running_loop()
        now = loop.time()
        futs: list[asyncio.Future[Any]] = []
        pending = self._pending
        self._out.extend(packed)
        for _ in packed:
            fut: asyncio.Future[Any] = loop.create_future()
            pending.append((fut, now))
            futs.append(fut)
        if self._flush_handle is None:
            self._flush_handle = loop.call_soon(self._flush)
        if self._timer is None and self._timeout is not None:
            self._timer = loop.call_later(self._timeout, self._check_timeout)
        # Replies come in order: when the last is in, so are all the others.
        try:
            await futs[-1]
        except ResponseError:
            pass
        except BaseException:
            for fut in futs:
                fut.cancel()  # nobody will look at their outcome now
            raise
        results: list[Any] = []
        for fut in futs:
            exc = fut.exception()
            if exc is not None and not isinstance(exc, ResponseError):
                raise exc
            results.append(exc if exc is not None else fut.result())
        return results

    def _flush(self) -> None:
        self._flush_handle = None
        out, self._out = self._out, []
        if self._writer is not None and out:
            self._writer.writelines(out)

    def _check_timeout(self) -> None:
        self._timer = None
        if not self._pending or self._timeout is None:
            return
        loop = asyncio.get_running_loop()
        age = loop.time() - self._pending[0][1]
        if age >= self._timeout and self._reader is not None:
            self._timed_out = True
            self._reader.cancel()
        else:
            self._timer = loop.call_later(self._timeout - age, self._check_timeout)

    async def _connect(self) -> Any:
        async with self._lock:
            if self._conn is not None:
                return self._conn
            conn = self._pool.make_connection()
            try:
                await conn.connect()
                if self.on_connect is not None:
                    await self.on_connect(conn)
            except BaseException:
                with contextlib.suppress(Exception):
                    await conn.disconnect()
                raise
            # redis-py has no public way to write without awaiting a drain per
            # command; its StreamWriter is what send_packed_command uses too.
            self._writer = conn._writer
            self._timed_out = False
            self._conn = conn
            self._reader = asyncio.get_running_loop().create_task(
                self._read(conn), name="tenure-redis-pipe"
            )
            return conn

    async def _read(self, conn: Any) -> None:
        pending = self._pending
        error: BaseException
        try:
            while True:
                try:
                    reply = await conn.read_response(timeout=math.inf, disconnect_on_error=False)
                except ResponseError as exc:
                    reply = exc
                if not pending:
                    raise RedisConnectionError("reply without a request")
                fut = pending.popleft()[0]
                if not fut.done():
                    if isinstance(reply, ResponseError):
                        fut.set_exception(reply)
                    else:
                        fut.set_result(reply)
        except asyncio.CancelledError:
            if not self._timed_out:
                error = RedisConnectionError("connection closed")
                self._fail(conn, error)
                raise
            error = RedisTimeoutError(f"no reply within {self._timeout} s")
        except Exception as exc:
            error = exc if isinstance(exc, RedisError) else RedisConnectionError(str(exc))
        self._fail(conn, error)
        with contextlib.suppress(Exception):
            await conn.disconnect(nowait=True)

    def _fail(self, conn: Any, error: BaseException) -> None:
        if self._conn is conn:
            self._conn = self._writer = None
            self._out.clear()
        while self._pending:
            fut = self._pending.popleft()[0]
            if not fut.done():
                fut.set_exception(error)

    async def aclose(self) -> None:
        reader, self._reader = self._reader, None
        conn = self._conn
        if reader is not None:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if conn is not None:
            self._fail(conn, RedisConnectionError("closed"))
            with contextlib.suppress(Exception):
                await conn.disconnect()


# -- the connection ------------------------------------------------------------------


class _DriverErrors:
    """``with`` block in which a driver error (``RedisError``, ``OSError``) is
    raised as :class:`BackendUnavailable`, chained, with the secrets removed."""

    __slots__ = ("_secrets", "_where")

    def __init__(self, where: str, secrets: Sequence[str]) -> None:
        self._where = where
        self._secrets = tuple(secrets)

    def error(self, exc: BaseException) -> BackendUnavailable:
        text = f"Redis at {self._where} failed: {type(exc).__name__}: {exc}"
        return BackendUnavailable(redact(text, self._secrets))

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None and isinstance(exc, _DRIVER_ERRORS):
            raise self.error(exc) from exc


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
        self.driver_errors = _DriverErrors(self.where, [s for s in secrets if isinstance(s, str)])
        # Bounds the commands in flight (so the connections), instead of redis-py's
        # pool failing with "Too many connections" under a burst.
        self.slots = asyncio.Semaphore(max_concurrency)
        self.pipe: _Pipe | None = None
        if not self.cluster and str(kwargs.get("protocol") or 2) == "2":
            self.pipe = _Pipe(client.connection_pool, kwargs.get("socket_timeout"))
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
        if not self.ready:
            await self.prepare()
        results: list[Any] = [None] * len(keys)
        todo = list(range(len(keys)))
        command, body = "EVALSHA", script.sha.encode()
        with self.driver_errors:
            for _ in range(2):
                if self.pipe is not None:
                    # Every command differs only in its key: pack the rest once.
                    tail = _pack(args)
                    tail = tail[tail.index(b"\n") + 1 :]  # without its "*<n>\r\n"
                    head = b"*%d\r\n" % (4 + len(args)) + _pack((command, body, 1))[4:]
                    packed = [
                        b"%b$%d\r\n%b\r\n%b" % (head, len(keys[i]), keys[i], tail) for i in todo
                    ]
                    replies = await self.pipe.execute_many(packed)
                else:
                    async with self.slots, self.client.pipeline(transaction=False) as pipe:
                        for i in todo:
                            pipe.execute_command(command, body, 1, keys[i], *args)
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


class RedisParts:
    """What the lease half and the event half share: the connection, the key
    prefix and the instance's name."""

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
