"""Leases and pub/sub on Redis: Lua scripts for leases, Streams for events.

Every lease operation is one Lua script (``backends/lua/*.lua``) run with
``EVALSHA`` in one round trip; the Python side only validates, encodes keys,
calls and translates.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import uuid
import warnings
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._contract import AcquireResult, LeaseRecord
from .._errors import BackendClosed, BackendUnavailable, ConfigurationError, InvalidArgument
from .._pubsub import Callback, Event, PubSub, check_callback, check_group, prepare_event
from .._url import redact_url
from .._validate import MAX_TTL_MS, check_keys, check_name, check_timeout, check_ttl
from .._waiters import KeyWaiters

__all__ = ["RedisStreamsPubSub"]

logger = logging.getLogger("tenure.redis")

# An idle key's fencing counter is kept this long (or twice its lease's TTL if
# longer). Its loss is harmless: tokens are at least the server's time in µs.
_COUNTER_KEEP_MS = 24 * 3600 * 1000
_RELEASED_CHANNEL = b"lease-released"
_EVICTING_POLICIES_OK = {"noeviction"}

# Query parameters of the URL that go to redis-py unchanged. Retry options are
# deliberately absent: a retried script could run twice.
_REDIS_QUERY: dict[str, Callable[[str], Any]] = {
    "db": int,
    "socket_timeout": float,
    "socket_connect_timeout": float,
    "max_connections": int,
    "health_check_interval": int,
    "client_name": str,
    "ssl_cert_reqs": str,
    "ssl_ca_certs": str,
    "ssl_certfile": str,
    "ssl_keyfile": str,
    "ssl_check_hostname": str,
}


def _to_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"not a boolean: {text!r}")


_OUR_QUERY: dict[str, Callable[[str], Any]] = {
    "prefix": str,
    "max_ttl_ms": int,
    "quarantine": _to_bool,
    "strict": _to_bool,
    "max_attempts": int,
    "stream_maxlen": int,
    "claim_idle_ms": int,
    "max_concurrency": int,
}


@dataclass(frozen=True)
class _Script:
    name: str
    body: bytes
    sha: str


def _load_script(name: str) -> _Script:
    body = resources.files(__package__).joinpath("lua", f"{name}.lua").read_bytes()
    return _Script(name, body, hashlib.sha1(body).hexdigest())


_ACQUIRE = _load_script("acquire")
_RENEW = _load_script("renew")
_RELEASE = _load_script("release")
_TRANSFER = _load_script("transfer")
_GET = _load_script("get")


def _inline_script(name: str, body: str) -> _Script:
    raw = body.encode("utf-8")
    return _Script(name, raw, hashlib.sha1(raw).hexdigest())


# Hand a leaving member's unacknowledged entries back to its group, in one atomic
# step: each is moved to the placeholder consumer ARGV[3] with an idle time of
# ARGV[4] ms (so every member's next reclaim takes it at once) and its delivery
# count lowered by one (the delivery that nobody finished is not counted, as
# on the other backends); then the member ARGV[2] of group ARGV[1] is deleted.
# Walks the member's pending list by id, so it ends even if an entry cannot move.
# Returns how many entries were handed back.
_HAND_BACK = _inline_script(
    "hand_back",
    """
local start, moved = '-', 0
while true do
  local pending = redis.call('XPENDING', KEYS[1], ARGV[1], start, '+', 100, ARGV[2])
  if #pending == 0 then
    break
  end
  for _, entry in ipairs(pending) do
    local count = tonumber(entry[4]) - 1
    if count < 0 then
      count = 0
    end
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[3], 0, entry[1],
               'IDLE', ARGV[4], 'RETRYCOUNT', count, 'JUSTID')
    moved = moved + 1
    start = '(' .. entry[1]
  end
end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
return moved
""",
)
# The consumer that holds handed-back entries until a member reclaims them. Real
# members are named "<instance hex>-<n>", so it cannot collide with one.
_RETURNED = b"tenure.returned"
# Idle time given to handed-back entries: far above any sensible claim_idle_ms,
# yet below the server's clock in ms (Redis ignores an IDLE that would place the
# delivery before the epoch).
_RETURNED_IDLE_MS = 10 * 365 * 24 * 3600 * 1000


def _tag(name: str) -> bytes:
    """``name`` as UTF-8 with ``%``, ``{`` and ``}`` percent-escaped.

    Injective, and free of braces, so it can sit inside a hash tag (which ends
    at the first ``}``) and be told apart from the fixed suffixes after it.
    """
    raw = name.encode("utf-8")
    if b"%" in raw or b"{" in raw or b"}" in raw:
        raw = raw.replace(b"%", b"%25").replace(b"{", b"%7B").replace(b"}", b"%7D")
    return raw


def _split_value(value: bytes) -> tuple[int, str]:
    token, _, owner = value.partition(b":")
    return int(token), owner.decode("utf-8")


def _parse_id(stream_id: bytes | str) -> tuple[int, int]:
    text = stream_id.decode() if isinstance(stream_id, bytes) else stream_id
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


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


@dataclass(eq=False)
class _Sub:
    topic: str
    callback: Callback
    stream: bytes
    group: str
    consumer: str
    fanout: bool
    task: asyncio.Task[None] | None = None
    # Set by unsubscribe: from then on the reader hands nothing to the callback.
    stopped: bool = False


class RedisStreamsPubSub(PubSub):
    """Leases (Lua scripts) and durable pub/sub (Redis Streams) on one Redis.

    **Leases.** Each operation is one Lua script, so the ownership check and
    the change are one atomic step on the server, in one round trip. Expiry is
    the key's ``PX`` on the server's clock; the client's clock is never used.
    A lease key holds ``"<token>:<owner>"``; next to it (same hash slot) a
    counter key holds the key's last fencing token. A new token is
    ``max(counter + 1, server time in µs)``, so tokens strictly increase per
    key also when the counter was cleaned up (it expires after 24 h idle) or
    lost. Keys are ``<prefix>{<key>}:lease`` and ``<prefix>{<key>}:token``
    with ``%``, ``{``, ``}`` of the key percent-escaped: the mapping is
    injective and each script touches one hash slot (Redis Cluster safe).

    **TTL limit.** ``ttl_ms`` may not exceed ``max_ttl_ms`` (default 60 000):
    it bounds how long a forgotten lease could still be in use, which the
    quarantine below relies on. Every client of a prefix must use the same
    ``max_ttl_ms``, at least the largest TTL any of them uses.

    **State loss and quarantine.** A Redis that restarts without persistence
    forgets every lease; granting at once could give a key two owners. Every
    grant of a key without a counter therefore looks at the server's uptime
    (in the same script): if the server started less than ``max_ttl_ms``
    (+1 s, +1%) ago, a lease granted before the start might still be in use,
    so the grant is refused and ``acquire_lease`` returns
    ``AcquireResult(acquired=False, owner=None)`` (no holder can be named).
    After that window every pre-restart lease has expired and grants resume.
    Consequences: a key used for the first time within ``max_ttl_ms`` of a
    server start is refused too (the server cannot tell a fresh start from a
    loss); on a server that has been up longer, first use is never delayed.
    ``quarantine=False`` turns the check off (for tests, or when you accept
    double grants after a restart). Not detected: an operator's ``FLUSHALL``
    or ``DEL`` on a server up longer than ``max_ttl_ms``; a restart from an
    RDB snapshot or an AOF with ``appendfsync everysec`` that lost the last
    writes while keeping older ones; a failover to a replica that had not yet
    received the latest grants (replication is asynchronous; ``WAIT`` is not
    used). In all of those a key can have two owners for up to one TTL, but
    fencing tokens still increase as long as the server clock does not go
    back. For leases, run Redis with ``appendonly yes``, ``appendfsync
    always`` and ``maxmemory-policy noeviction``.

    **Eviction.** At first use the backend reads ``maxmemory-policy``; any
    policy but ``noeviction`` can evict live leases, so it logs a warning, or
    with ``strict=True`` every operation raises :class:`ConfigurationError`.

    **Failures.** Connection failures and timeouts (``socket_timeout``,
    default 5 s) raise :class:`BackendUnavailable`; the outcome of the
    operation is then unknown (every lease operation is safe to retry, but
    a retried transfer that had succeeded reports ``False``). Lease scripts
    are never re-sent by a retry layer, so one never runs twice; if an
    ``EVALSHA`` finds the server's script cache empty (``SCRIPT FLUSH``,
    restart) it is re-sent once as ``EVAL``, which is safe because
    ``NOSCRIPT`` means it did not run. The client built by :meth:`from_url`
    has redis-py's retries off for every other command too; an injected
    client keeps its own settings for stream commands (and, if it speaks
    RESP3, for lease commands: build it with ``retry=Retry(NoBackoff(), 0)``).

    **Connections.** Lease commands share one pipelined connection: a lone
    caller gets one round trip per operation, concurrent callers share
    writes and reads. Replies later than ``socket_timeout`` fail every
    waiting call with :class:`BackendUnavailable` and the connection is
    replaced. Stream commands use redis-py's pool (at most
    ``max_concurrency`` at once, plus one blocking reader per subscription);
    :meth:`wait_lease_released` uses one pub/sub connection.

    **Waiting.** ``release_lease`` and ``transfer_lease`` publish the key on
    ``<prefix>lease-released``; :meth:`wait_lease_released` listens on one
    pub/sub connection per backend and wakes one local waiter per message.
    During a quarantine it waits for the quarantine's end instead of
    answering "free" at once.

    **Construction.** ``RedisStreamsPubSub(client, **options)`` takes an
    existing ``redis.asyncio.Redis`` (``decode_responses`` must be off); it
    is not closed by :meth:`aclose` unless ``owns_client=True``.
    :meth:`from_url` builds and owns its client. Nothing connects before the
    first operation.

    **Events.** A topic is a stream ``<prefix>{<topic>}:stream`` (``XADD``
    with ``MAXLEN ~ stream_maxlen``; trimming can drop events a slow group
    has not read). A ``group`` is a consumer group (created at the stream's
    end the first time, then durable); a fan-out subscription gets a private
    group that is destroyed on unsubscribe and on ``aclose()`` (a process that
    dies leaves it behind: it holds no data but stays listed). A callback
    that returns acknowledges (``XACK``); one that raises gets the event again
    with ``attempt`` increased, up to ``max_attempts`` (default 5), then the
    event is acknowledged, dropped and logged at ERROR. Events a dead member
    of a group never acknowledged are claimed by a live member after
    ``claim_idle_ms`` (default 30 000) idle, with ``attempt`` = deliveries so
    far + 1. Events a member had not acknowledged when it unsubscribed (or
    its backend was closed) are handed back to the group at once and taken by
    the next member that looks (see :meth:`unsubscribe`). Delivery is at
    least once: a callback slower than ``claim_idle_ms`` can see its event
    handed to another member too.
    """

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        prefix: str = "tenure:",
        max_ttl_ms: int = 60_000,
        quarantine: bool = True,
        strict: bool = False,
        max_attempts: int = 5,
        stream_maxlen: int = 100_000,
        claim_idle_ms: int = 30_000,
        block_ms: int = 1000,
        max_concurrency: int = 128,
        owns_client: bool = False,
    ) -> None:
        if not isinstance(client, aioredis.Redis):
            raise ConfigurationError(
                f"client must be a redis.asyncio.Redis, got {type(client).__name__}"
            )
        if client.connection_pool.connection_kwargs.get("decode_responses"):
            raise ConfigurationError("the Redis client must have decode_responses=False")
        if not isinstance(prefix, str) or "{" in prefix or "}" in prefix:
            raise ConfigurationError(f"prefix must be a str without braces, got {prefix!r}")
        for name, value, low in [
            ("max_ttl_ms", max_ttl_ms, 1),
            ("max_attempts", max_attempts, 1),
            ("stream_maxlen", stream_maxlen, 1),
            ("claim_idle_ms", claim_idle_ms, 1),
            ("block_ms", block_ms, 1),
            ("max_concurrency", max_concurrency, 1),
        ]:
            if type(value) is not int or value < low:
                raise InvalidArgument(f"{name} must be an int >= {low}, got {value!r}")
        if max_ttl_ms > MAX_TTL_MS:
            raise InvalidArgument(f"max_ttl_ms must be at most {MAX_TTL_MS}, got {max_ttl_ms}")
        self._client = client
        # redis-py leaves execute_command untyped; this also saves a lookup per call.
        self._execute = cast(Callable[..., Awaitable[Any]], client.execute_command)
        self._owns_client = owns_client
        self._prefix = prefix
        self._p = prefix.encode("utf-8")
        self._channel = self._p + _RELEASED_CHANNEL
        self._max_ttl_ms = max_ttl_ms
        self._quarantine_ms = max_ttl_ms if quarantine else 0
        self._strict = bool(strict)
        self._max_attempts = max_attempts
        self._stream_maxlen = stream_maxlen
        self._claim_idle_ms = claim_idle_ms
        socket_timeout = client.connection_pool.connection_kwargs.get("socket_timeout")
        # A blocking read must return before the socket timeout fires.
        if socket_timeout:
            block_ms = max(1, min(block_ms, int(socket_timeout * 500)))
        self._block_ms = block_ms
        kwargs = client.connection_pool.connection_kwargs
        self._password: str | None = kwargs.get("password")
        if "path" in kwargs:
            self._where = f"unix:{kwargs['path']}/{kwargs.get('db', 0)}"
        else:
            self._where = f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"
        # Bounds the commands in flight (so the connections), instead of redis-py's
        # pool failing with "Too many connections" under a burst.
        self._slots = asyncio.Semaphore(max_concurrency)
        # Lease commands go through one pipelined connection (RESP2 only; an
        # injected RESP3 client uses its pool like the other commands).
        self._pipe: _Pipe | None = None
        if str(kwargs.get("protocol") or 2) == "2":
            self._pipe = _Pipe(client.connection_pool, kwargs.get("socket_timeout"))
        # Local (event-loop clock) end of the last quarantine we were told about.
        self._quarantine_deadline = 0.0
        self._ready = False
        self._config_error: ConfigurationError | None = None
        self._prepare_lock = asyncio.Lock()
        self._closed = False
        self._waiters = KeyWaiters()
        self._pubsub: Any = None
        self._listener: asyncio.Task[None] | None = None
        self._listen_lock = asyncio.Lock()
        self._subs: dict[str, dict[Callback, _Sub]] = {}
        self._published: dict[str, tuple[int, int]] = {}
        self._instance = uuid.uuid4().hex[:12]
        self._consumers = 0

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisStreamsPubSub:
        """``redis://[user[:password]@]host[:port][/db][?…]`` or ``rediss://…`` (TLS).

        Query parameters: ``prefix``, ``max_ttl_ms``, ``quarantine``,
        ``strict``, ``max_attempts``, ``stream_maxlen``, ``claim_idle_ms``
        (see the class docstring), and for redis-py ``db``,
        ``socket_timeout``, ``socket_connect_timeout``, ``max_connections``,
        ``health_check_interval``, ``client_name`` and the ``ssl_*`` options.
        Any other parameter raises :class:`ConfigurationError`. Keyword
        ``options`` override the query. Nothing is connected until first use.
        """
        shown = redact_url(url)
        try:
            parts = urlsplit(url)
        except ValueError as exc:
            raise ConfigurationError(f"cannot parse Redis URL {shown!r}: {exc}") from None
        if parts.scheme.lower() not in {"redis", "rediss"}:
            raise ConfigurationError(f"not a redis:// or rediss:// URL: {shown!r}")
        ours: dict[str, Any] = {}
        theirs: list[tuple[str, str]] = []
        for name, value in parse_qsl(parts.query, keep_blank_values=True):
            try:
                if name in _OUR_QUERY:
                    ours[name] = _OUR_QUERY[name](value)
                elif name in _REDIS_QUERY:
                    _REDIS_QUERY[name](value)
                    theirs.append((name, value))
                else:
                    known = ", ".join(sorted([*_OUR_QUERY, *_REDIS_QUERY]))
                    raise ConfigurationError(
                        f"unknown query parameter {name!r} in Redis URL {shown!r}; known: {known}"
                    )
            except ValueError:
                raise ConfigurationError(
                    f"bad value for {name!r} in Redis URL {shown!r}: {value!r}"
                ) from None
        redis_url = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(theirs), ""))
        ours.update(options)
        redis_options = {
            k: ours.pop(k)
            for k in list(ours)
            if k not in _OUR_QUERY and k not in {"block_ms", "owns_client"}
        }
        redis_options.setdefault("socket_timeout", 5.0)
        redis_options.setdefault("socket_connect_timeout", 5.0)
        # The command slots bound the connections; the pool must never refuse.
        redis_options.setdefault("max_connections", 2**31)
        try:
            client = aioredis.Redis.from_url(
                redis_url, retry=Retry(NoBackoff(), 0), retry_on_timeout=False, **redis_options
            )
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"cannot use Redis URL {shown!r}: {exc}") from None
        ours["owns_client"] = True
        return cls(client, **ours)

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"RedisStreamsPubSub({self._where}, prefix={self._prefix!r}{state})"

    # -- plumbing ------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise BackendClosed("RedisStreamsPubSub is closed")

    def _check_ttl(self, ttl_ms: Any, arg: str = "ttl_ms") -> int:
        ttl = check_ttl(ttl_ms, arg)
        if ttl > self._max_ttl_ms:
            raise InvalidArgument(
                f"{arg} must be at most max_ttl_ms={self._max_ttl_ms} on this backend, got {ttl} "
                "(raise max_ttl_ms for every client of the prefix)"
            )
        return ttl

    def _unavailable(self, exc: BaseException) -> BackendUnavailable:
        text = f"Redis at {self._where} failed: {type(exc).__name__}: {exc}"
        if self._password:
            text = text.replace(self._password, "***")
        return BackendUnavailable(text)

    def _lease_key(self, key: str) -> tuple[bytes, bytes]:
        base = self._p + b"{" + _tag(key) + b"}:"
        return base + b"lease", base + b"token"

    async def _prepare(self) -> None:
        async with self._prepare_lock:
            if self._ready:
                return
            task = asyncio.current_task()
            cancels = 0 if task is None else task.cancelling()
            try:
                info = await self._client.info("memory")
            except (RedisError, OSError) as exc:
                raise self._unavailable(exc) from exc
            if task is not None and task.cancelling() > cancels:
                raise asyncio.CancelledError  # lost by redis-py: see ``_io``
            policy = str(info.get("maxmemory_policy", "unknown"))
            if policy not in _EVICTING_POLICIES_OK:
                message = (
                    f"Redis at {self._where} has maxmemory-policy {policy!r}: it can evict live "
                    "leases and stream entries; set maxmemory-policy noeviction"
                )
                if self._strict:
                    self._config_error = ConfigurationError(message)
                else:
                    logger.warning("%s", message)
            self._ready = True

    async def _call(self, *args: Any) -> Any:
        if not self._ready:
            await self._prepare()
        if self._config_error is not None:
            raise self._config_error
        try:
            if self._pipe is not None:
                return await self._pipe.execute(*args)
            async with self._slots:
                return await self._execute(*args)
        except (RedisError, OSError) as exc:
            raise self._unavailable(exc) from exc

    async def _io(
        self,
        method: Callable[..., Awaitable[Any]],
        *args: Any,
        blocking: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Run ``method(*args, **kwargs)`` (a redis-py client method) with the
        usual checks and error translation.

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
        if not self._ready:
            await self._prepare()
        if self._config_error is not None:
            raise self._config_error
        try:
            if blocking:
                result = await method(*args, **kwargs)
            else:
                async with self._slots:
                    result = await method(*args, **kwargs)
        except (RedisError, OSError) as exc:
            raise self._unavailable(exc) from exc
        if task is not None and task.cancelling() > cancels:
            raise asyncio.CancelledError
        return result

    async def _eval(self, script: _Script, keys: Sequence[bytes], args: Sequence[Any]) -> Any:
        if not self._ready:
            await self._prepare()
        if self._config_error is not None:
            raise self._config_error
        try:
            if self._pipe is not None:
                execute = self._pipe.execute
                try:
                    return await execute("EVALSHA", script.sha, len(keys), *keys, *args)
                except NoScriptError:
                    # The script did not run, so sending its body is not a second run.
                    return await execute("EVAL", script.body, len(keys), *keys, *args)
            async with self._slots:
                try:
                    return await self._execute("EVALSHA", script.sha, len(keys), *keys, *args)
                except NoScriptError:
                    return await self._execute("EVAL", script.body, len(keys), *keys, *args)
        except (RedisError, OSError) as exc:
            raise self._unavailable(exc) from exc

    # -- leases ----------------------------------------------------------------

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
        """Claim ``key``; see the class docstring for the quarantine result."""
        check_name(key, "key")
        check_name(owner, "owner")
        ttl = self._check_ttl(ttl_ms)
        self._check_open()
        lease, counter = self._lease_key(key)
        status, value = await self._eval(
            _ACQUIRE,
            (lease, counter),
            (owner, ttl, self._quarantine_ms, max(_COUNTER_KEEP_MS, 2 * ttl)),
        )
        if status == 1:
            return AcquireResult(True, owner, int(value))
        if status == 0:
            return AcquireResult(False, value.decode("utf-8"), None)
        remaining = int(value) / 1000
        loop = asyncio.get_running_loop()
        if loop.time() >= self._quarantine_deadline:
            logger.warning(
                "lease %r refused: Redis at %s started less than max_ttl_ms ago and does not "
                "know the key, so it may have lost leases; grants resume in %.1f s",
                key,
                self._where,
                remaining,
            )
        self._quarantine_deadline = loop.time() + remaining
        return AcquireResult(False, None, None)

    async def get_lease_owner(self, key: str) -> str | None:
        check_name(key, "key")
        self._check_open()
        value = await self._call("GET", self._lease_key(key)[0])
        return None if value is None else _split_value(value)[1]

    async def get_lease(self, key: str) -> LeaseRecord | None:
        """The live lease of ``key`` (owner, token, remaining ms), read in one script."""
        check_name(key, "key")
        self._check_open()
        reply = await self._eval(_GET, (self._lease_key(key)[0],), ())
        if not reply:
            return None
        token, owner = _split_value(reply[0])
        return LeaseRecord(owner, token, max(1, int(reply[1])))

    async def release_lease(self, key: str, owner: str) -> None:
        check_name(key, "key")
        check_name(owner, "owner")
        self._check_open()
        await self._eval(
            _RELEASE, (self._lease_key(key)[0],), (owner, self._channel, key.encode("utf-8"))
        )

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        check_name(key, "key")
        check_name(owner, "owner")
        ttl = self._check_ttl(ttl_ms)
        self._check_open()
        return bool(await self._eval(_RENEW, (self._lease_key(key)[0],), (owner, ttl)))

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        check_name(key, "key")
        check_name(from_owner, "from_owner")
        check_name(to_owner, "to_owner")
        ttl = self._check_ttl(ttl_ms)
        self._check_open()
        lease, counter = self._lease_key(key)
        reply = await self._eval(
            _TRANSFER,
            (lease, counter),
            (
                from_owner,
                to_owner,
                ttl,
                max(_COUNTER_KEEP_MS, 2 * ttl),
                self._channel,
                key.encode("utf-8"),
            ),
        )
        return reply is not None

    # -- extensions --------------------------------------------------------------

    async def renew_leases(self, keys: Sequence[str], owner: str, ttl_ms: int) -> list[bool]:
        """Renew many of ``owner``'s leases in one round trip; one ``bool`` per key, in order.

        The keys live in different hash slots, so this is one renew script
        per key, all written at once on the pipelined lease connection (not a
        transaction): each renewal is atomic on its own. If the server's script cache was flushed, the renewals that
        got ``NOSCRIPT`` (and therefore did not run) are re-sent as ``EVAL``.
        """
        keys = check_keys(keys)
        check_name(owner, "owner")
        ttl = self._check_ttl(ttl_ms)
        self._check_open()
        if not keys:
            return []
        if not self._ready:
            await self._prepare()
        if self._config_error is not None:
            raise self._config_error
        leases = [self._lease_key(key)[0] for key in keys]
        owner_b = owner.encode("utf-8")
        results: list[Any] = [None] * len(leases)
        todo = list(range(len(leases)))
        command, script = "EVALSHA", _RENEW.sha.encode()
        try:
            for _ in range(2):
                if self._pipe is not None:
                    # Every command differs only in its key: pack the rest once.
                    head = _pack((command, script, 1))[4:]  # without "*3\r\n"
                    tail = _pack((owner_b, ttl))[4:]
                    packed = [
                        b"*6\r\n%b$%d\r\n%b\r\n%b" % (head, len(leases[i]), leases[i], tail)
                        for i in todo
                    ]
                    replies = await self._pipe.execute_many(packed)
                else:
                    async with self._slots, self._client.pipeline(transaction=False) as pipe:
                        for i in todo:
                            pipe.execute_command(command, script, 1, leases[i], owner_b, ttl)
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
                todo, command, script = missing, "EVAL", _RENEW.body
        except (RedisError, OSError) as exc:
            raise self._unavailable(exc) from exc
        return [bool(r) for r in results]

    async def wait_lease_released(self, key: str, timeout: float) -> bool:
        """Wait until ``key`` is released or transferred, at most ``timeout`` seconds.

        ``True`` at once if the key has no live lease (during a quarantine
        that this backend was told about: when it ends); ``True`` when a release
        or transfer of the key (by any client of the prefix) wakes this waiter
        (one local waiter per notification), or when the notification
        connection was lost (a notification may have been missed: look again);
        ``False`` on timeout.
        """
        check_name(key, "key")
        seconds = check_timeout(timeout)
        self._check_open()
        fut = self._waiters.register(key)
        try:
            await self._ensure_listener()
            free = await self.get_lease_owner(key) is None
        except BaseException:
            self._waiters.discard(key, fut)
            raise
        if free:
            self._waiters.discard(key, fut)
            # A free key is not grantable during a quarantine: wait for its end
            # rather than send a caller that retries acquire_lease into a hot loop.
            left = self._quarantine_deadline - asyncio.get_running_loop().time()
            if left > 0:
                await asyncio.sleep(min(left, seconds))
                return left <= seconds
            return True
        return await self._waiters.wait(key, fut, seconds)

    async def _ensure_listener(self) -> None:
        if self._listener is not None and not self._listener.done():
            return
        async with self._listen_lock:
            if self._listener is not None and not self._listener.done():
                return
            if not self._ready:
                await self._prepare()
            pubsub = self._client.pubsub()
            try:
                await pubsub.subscribe(self._channel)
                # Wait for the confirmation: a release before it would be missed.
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 10.0
                while True:
                    msg = await pubsub.get_message(timeout=1.0)
                    if msg is not None and msg["type"] == "subscribe":
                        break
                    if loop.time() > deadline:
                        raise TimeoutError("no confirmation of SUBSCRIBE")
            except (RedisError, OSError) as exc:
                await self._close_pubsub(pubsub)
                raise self._unavailable(exc) from exc
            except BaseException:
                await self._close_pubsub(pubsub)
                raise
            self._pubsub = pubsub
            self._listener = loop.create_task(
                self._listen(pubsub), name=f"tenure-redis-listener-{self._instance}"
            )

    async def _listen(self, pubsub: Any) -> None:
        loop = asyncio.get_running_loop()
        last_ping = loop.time()
        try:
            while True:
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if msg is not None and msg["type"] == "message":
                    self._waiters.wake_one(msg["data"].decode("utf-8"))
                elif msg is None and loop.time() - last_ping > 5.0:
                    # Detects a dead or paused server while no message flows.
                    last_ping = loop.time()
                    await pubsub.ping()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning(
                "lease notification connection to Redis at %s lost (%s); waking every waiter",
                self._where,
                type(exc).__name__,
            )
        finally:
            self._waiters.wake_all()
            if self._pubsub is pubsub:
                self._pubsub = None
            await self._close_pubsub(pubsub)

    @staticmethod
    async def _close_pubsub(pubsub: Any) -> None:
        with contextlib.suppress(Exception):
            await pubsub.aclose()

    # -- pub/sub ---------------------------------------------------------------

    def _stream_key(self, topic: str) -> bytes:
        return self._p + b"{" + _tag(topic) + b"}:stream"

    async def publish(self, topic: str, event: Event) -> Event:
        check_name(topic, "topic")
        event = prepare_event(event)
        self._check_open()
        payload: dict[Any, Any] = {b"e": event.to_json().encode("utf-8")}
        stream_id = await self._io(
            self._client.xadd,
            self._stream_key(topic),
            payload,
            maxlen=self._stream_maxlen,
            approximate=True,
        )
        parsed = _parse_id(stream_id)
        if parsed > self._published.get(topic, (0, 0)):
            self._published[topic] = parsed
        return event

    async def subscribe(self, topic: str, callback: Callback, *, group: str | None = None) -> None:
        """Deliver ``topic`` to ``callback``: every event (no ``group``) or a share of the group's.

        A new group, and every fan-out subscription, starts at the end of the
        stream: events published after this returns are delivered. An
        existing group continues where it was.
        """
        check_name(topic, "topic")
        check_callback(callback)
        check_group(group)
        self._check_open()
        subs = self._subs.setdefault(topic, {})
        if callback in subs:
            raise InvalidArgument(f"callback is already subscribed to topic {topic!r}")
        self._consumers += 1
        name = f"f:{uuid.uuid4().hex}" if group is None else f"g:{group}"
        sub = _Sub(
            topic=topic,
            callback=callback,
            stream=self._stream_key(topic),
            group=name,
            consumer=f"{self._instance}-{self._consumers}",
            fanout=group is None,
        )
        subs[callback] = sub
        try:
            await self._create_group(sub)
        except BaseException:
            subs.pop(callback, None)
            if not subs:
                self._subs.pop(topic, None)
            raise
        sub.task = asyncio.get_running_loop().create_task(
            self._read_loop(sub), name=f"tenure-redis-{topic}"
        )

    async def _create_group(self, sub: _Sub) -> None:
        try:
            await self._io(self._client.xgroup_create, sub.stream, sub.group, "$", mkstream=True)
        except BackendUnavailable as exc:
            cause = exc.__cause__
            if not (isinstance(cause, ResponseError) and "BUSYGROUP" in str(cause)):
                raise

    async def unsubscribe(self, topic: str, callback: Callback) -> None:
        """Stop ``callback``; a fan-out subscription's private group is destroyed.

        In a named group, the events this member was given but had not
        acknowledged (one being handled at that moment, or read but not yet
        handed to the callback) are handed back to the group before this
        returns: each member reclaims them at its next look (when it
        subscribes, then at least every ``min(block_ms, claim_idle_ms / 2)``),
        without waiting for ``claim_idle_ms``, and with the delivery that was
        not finished not counted in ``attempt``. The member is then removed
        from the group. Raises :class:`BackendUnavailable` if Redis could not
        be reached; the events then stay with this member until another one
        claims them after ``claim_idle_ms``.
        """
        check_name(topic, "topic")
        self._check_open()
        subs = self._subs.get(topic, {})
        sub = subs.pop(callback, None)
        if not subs:
            self._subs.pop(topic, None)
        if sub is None:
            return
        await self._stop(sub)
        await self._retire(sub)

    @staticmethod
    async def _stop(sub: _Sub) -> None:
        """End the reader of ``sub``; when this returns it takes no more entries."""
        sub.stopped = True
        task = sub.task
        if task is None:
            return
        # One cancel is not always enough: redis-py can lose it (see ``_io``), and
        # a callback can swallow it. Cancel again until the reader has ended; it
        # also checks ``stopped`` between steps.
        while not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=0.1)
        await asyncio.gather(task, return_exceptions=True)

    async def _retire(self, sub: _Sub) -> None:
        """Remove a stopped subscription's trace: its private group, or its member.

        A group member's unacknowledged entries are handed back to the group
        first (see ``unsubscribe``), in the same script that deletes the
        member, so none is dropped with it.
        """
        client = self._client
        if sub.fanout:
            await self._io(client.xgroup_destroy, sub.stream, sub.group)
            return
        try:
            moved = await self._eval(
                _HAND_BACK,
                (sub.stream,),
                (sub.group, sub.consumer, _RETURNED, _RETURNED_IDLE_MS),
            )
        except BackendUnavailable as exc:
            cause = exc.__cause__
            if isinstance(cause, ResponseError) and "NOGROUP" in str(cause):
                return  # the group is gone, and with it whatever it held
            raise
        if moved:
            logger.debug(
                "topic %r: handed %d unacknowledged events back to group %r",
                sub.topic,
                moved,
                sub.group,
            )

    async def flush(self) -> None:
        """Wait until local subscribers are done with what this instance published.

        Guarantee: for every topic this instance published to and that has a
        local subscriber, every event published through this instance before
        the call has been delivered by each local subscription's consumer
        group and is no longer pending at that subscription (its callback
        returned, or the event was dropped after ``max_attempts``). An event
        of a named group taken by a member in another process is not waited
        for, nor are events published by other clients. Polls Redis every
        5 ms; returns early if the backend is closed meanwhile.
        """
        self._check_open()
        client = self._client
        targets = dict(self._published)
        while not self._closed:
            busy = False
            for topic, target in targets.items():
                subs = list(self._subs.get(topic, {}).values())
                if not subs:
                    continue
                groups = await self._io(client.xinfo_groups, subs[0].stream)
                delivered = {g["name"]: g["last-delivered-id"] for g in groups}
                end = f"{target[0]}-{target[1]}"
                for sub in subs:
                    last = delivered.get(sub.group.encode("utf-8"))
                    if last is None or _parse_id(last) < target:
                        busy = True
                        break
                    pending = await self._io(
                        client.xpending_range, sub.stream, sub.group, "-", end, 1, sub.consumer
                    )
                    if pending:
                        busy = True
                        break
                if busy:
                    break
            if not busy:
                return
            await asyncio.sleep(0.005)

    async def _read_loop(self, sub: _Sub) -> None:
        loop = asyncio.get_running_loop()
        client = self._client
        backoff = 0.05
        next_claim = loop.time()
        # Entries handed back by a leaving member are claimable at once: look for
        # them at least once per blocking read, not only every claim_idle_ms / 2.
        claim_every = min(self._claim_idle_ms / 2000, self._block_ms / 1000)
        # After a failure, first re-read this consumer's own pending entries: a
        # lost XREADGROUP reply or XACK leaves them there, and ">" never
        # returns them again.
        history = False
        while not sub.stopped:
            try:
                if not sub.fanout and loop.time() >= next_claim:
                    next_claim = loop.time() + claim_every
                    await self._reclaim(sub)
                if history:
                    await self._redeliver_own(sub)
                    history = False
                reply = await self._io(
                    client.xreadgroup,
                    sub.group,
                    sub.consumer,
                    {sub.stream: ">"},
                    count=64,
                    block=self._block_ms,
                    blocking=True,
                )
                backoff = 0.05
                for entry_id, fields in _entries(reply):
                    await self._handle(sub, entry_id, fields, 1)
            except BackendUnavailable as exc:
                history = True
                cause = exc.__cause__
                if isinstance(cause, ResponseError) and "NOGROUP" in str(cause):
                    # The stream or group vanished (deleted, or a restart without
                    # persistence): start again at the end of the stream.
                    logger.warning(
                        "consumer group of topic %r disappeared; recreating it", sub.topic
                    )
                    with contextlib.suppress(BackendUnavailable):
                        await self._create_group(sub)
                    continue
                logger.warning(
                    "reading topic %r from Redis at %s failed (%s); retrying in %.2f s",
                    sub.topic,
                    self._where,
                    exc,
                    backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    async def _redeliver_own(self, sub: _Sub) -> None:
        """Handle the entries this consumer was given but never acknowledged."""
        client = self._client
        while True:
            pending = await self._io(
                client.xpending_range, sub.stream, sub.group, "-", "+", 64, sub.consumer
            )
            if not pending:
                return
            counts = {p["message_id"]: int(p["times_delivered"]) for p in pending}
            # XCLAIM to ourselves bumps the delivery count and returns the entries.
            claimed = await self._io(
                client.xclaim, sub.stream, sub.group, sub.consumer, 0, list(counts)
            )
            for entry_id, fields in claimed or ():
                await self._handle(sub, entry_id, fields, counts.get(entry_id, 1) + 1)
            if len(pending) < 64:
                return

    async def _reclaim(self, sub: _Sub) -> None:
        """Take over events that other consumers of the group left unacknowledged."""
        client = self._client
        pending = await self._io(
            client.xpending_range, sub.stream, sub.group, "-", "+", 64, idle=self._claim_idle_ms
        )
        counts = {
            p["message_id"]: int(p["times_delivered"])
            for p in pending
            if p["consumer"] != sub.consumer.encode("utf-8")
        }
        if not counts:
            return
        claimed = await self._io(
            client.xclaim, sub.stream, sub.group, sub.consumer, self._claim_idle_ms, list(counts)
        )
        for entry_id, fields in claimed or ():
            await self._handle(sub, entry_id, fields, counts.get(entry_id, 1) + 1)

    async def _handle(self, sub: _Sub, entry_id: bytes, fields: Any, attempt: int) -> None:
        if sub.stopped:
            return  # left pending: unsubscribe hands it back to the group
        client = self._client
        raw = fields.get(b"e") if isinstance(fields, dict) else None
        event: Event | None = None
        if raw is not None:
            try:
                event = Event.from_json(raw, attempt=attempt)
            except (ValueError, KeyError, TypeError):
                logger.error(
                    "topic %r: entry %r is not a tenure event; dropping it", sub.topic, entry_id
                )
        if event is not None and event.attempt > self._max_attempts:
            logger.error(
                "topic %r: event %s was delivered %d times without success; dropping it",
                sub.topic,
                event.id,
                event.attempt - 1,
            )
            event = None
        while event is not None:
            try:
                await sub.callback(event)
            except Exception:
                if event.attempt >= self._max_attempts:
                    logger.error(
                        "callback for topic %r raised on event %s %d times; dropping it",
                        sub.topic,
                        event.id,
                        event.attempt,
                        exc_info=True,
                    )
                    break
                logger.warning(
                    "callback for topic %r raised on event %s (attempt %d of %d); redelivering",
                    sub.topic,
                    event.id,
                    event.attempt,
                    self._max_attempts,
                    exc_info=True,
                )
                event = replace(event, attempt=event.attempt + 1)
                # Record the attempt in the group (and reset the idle time) so a
                # crash now resumes with the right count and nobody steals it.
                with contextlib.suppress(BackendUnavailable):
                    await self._io(
                        client.xclaim,
                        sub.stream,
                        sub.group,
                        sub.consumer,
                        0,
                        [entry_id],
                        retrycount=event.attempt,
                        justid=True,
                    )
            else:
                break
        # CancelledError skips this: the event stays pending, and in a named
        # group another member claims it.
        await self._io(client.xack, sub.stream, sub.group, entry_id)

    # -- closing ---------------------------------------------------------------

    async def aclose(self) -> None:
        """Stop every reader and the listener, drop private groups, close connections."""
        if self._closed:
            return
        self._closed = True
        subs = [s for topic in self._subs.values() for s in topic.values()]
        self._subs.clear()
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.cancel()
        await asyncio.gather(*(self._stop(sub) for sub in subs))
        if listener is not None:
            await asyncio.gather(listener, return_exceptions=True)
        self._waiters.wake_all()
        if subs and self._ready and self._config_error is None:
            # Best effort: a dead server must not hold up closing.
            try:
                async with asyncio.timeout(2.0):
                    for sub in subs:
                        await self._retire(sub)
            except (TimeoutError, BackendUnavailable) as exc:
                logger.warning("could not remove consumer groups at close: %s", exc)
        if self._pipe is not None:
            await self._pipe.aclose()
        if self._owns_client:
            with contextlib.suppress(Exception):
                await self._client.aclose()

    def __del__(self, _warn: Callable[..., None] = warnings.warn) -> None:
        if not getattr(self, "_closed", True) and getattr(self, "_subs", None):
            _warn(f"unclosed {self!r} with active subscriptions", ResourceWarning, stacklevel=1)


def _entries(reply: Any) -> list[tuple[bytes, Any]]:
    """Stream entries from an ``XREADGROUP`` reply (RESP2 list or RESP3 map)."""
    if not reply:
        return []
    streams = reply.values() if isinstance(reply, dict) else (s[1] for s in reply)
    out: list[tuple[bytes, Any]] = []
    for entries in streams:
        out.extend((entry[0], entry[1]) for entry in entries)
    return out
