"""Building the redis-py client from a URL: tenure's options and the driver's,
Sentinel and Cluster addresses, and redis-py's retries turned off."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.connection import URL_QUERY_ARGUMENT_PARSERS
from redis.exceptions import RedisClusterException, RedisError

from ..._errors import ConfigurationError
from ..._url_options import parse_query, redact, redact_url, to_bool, to_int, url_secrets

__all__ = [
    "CLUSTER_SCHEME",
    "OUR_OPTIONS",
    "SENTINEL_SCHEME",
    "THEIR_OPTIONS",
    "client_from_url",
    "client_settings",
]


def client_settings(client: Any) -> dict[str, Any]:
    """The connection settings of a ``Redis`` (its pool's) or a ``RedisCluster``."""
    if isinstance(client, RedisCluster):
        return client.connection_kwargs
    return cast(dict[str, Any], client.connection_pool.connection_kwargs)


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
    "retention_ms": to_int(0),
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
    sentinel = Sentinel(sentinels, sentinel_kwargs=sentinel_options)  # type: ignore[no-untyped-call, unused-ignore]  # untyped before redis-py 8
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
