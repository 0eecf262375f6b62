"""tenure's link to an etcd cluster: the gRPC channel, the URL, and the one
place where gRPC's errors become tenure's.

The messages and stubs are those generated from etcd's protocol files and
shipped by ``aetcd`` (``aetcd.rpc``); the channel is built here, because
tenure needs what ``aetcd.Client`` does not offer: every member of the
cluster as an endpoint (round robin, so a dead member costs one failed call,
not the client), TLS, and keep-alive pings that find a paused member.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

# aetcd first: without the extra, the ImportError names it (see tenure._url).
from aetcd import rpc  # isort: skip
import grpc  # isort: skip
import grpc.aio  # isort: skip

from ..._errors import BackendUnavailable, ConfigurationError
from ..._url_options import parse_query, redact_url, to_int, to_seconds

__all__ = ["EtcdChannel", "parse_url", "rpc"]

logger = logging.getLogger("tenure.etcd")

_DEFAULT_PORT = 2379
# etcd refuses pings more often than --grpc-keepalive-min-time (5 s by default).
_KEEPALIVE_MS = 5000
_KEEPALIVE_TIMEOUT_MS = 2000


# gRPC's core (its threads, its poller) does not survive fork(): a child of a
# process that made a channel crashes on its first call. Such a child gets a
# clear error instead. The pid of the first process that made a channel:
_grpc_used_by: int | None = None


def _check_not_forked() -> None:
    global _grpc_used_by
    if _grpc_used_by is None:
        _grpc_used_by = os.getpid()
    elif _grpc_used_by != os.getpid():
        raise ConfigurationError(
            f"this process was forked from process {_grpc_used_by}, which had used etcd: gRPC "
            "(the etcd client) cannot work in such a child. Start workers with the 'spawn' or "
            "'forkserver' method (multiprocessing.set_start_method), or fork before the "
            "first etcd call"
        )


def _path(text: str) -> str:
    if not Path(text).is_file():
        raise ValueError("no such file")
    return text


# tenure's options in an etcd:// URL.
_OPTIONS: dict[str, Callable[[str], Any]] = {
    "prefix": str,
    "max_ttl_ms": to_int(1),
    "timeout": to_seconds,
    "ca": _path,
    "cert": _path,
    "key": _path,
}


def parse_url(url: str, options: dict[str, Any]) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """The endpoints of ``etcd://h:p[,h:p…][?…]`` and its options (keywords override the query)."""
    shown = redact_url(url)
    try:
        parts = urlsplit(url)
    except ValueError:
        raise ConfigurationError(f"cannot parse the etcd URL {shown!r}") from None
    netloc = parts.netloc
    if "@" in netloc:
        raise ConfigurationError(
            f"etcd authentication (user-info in the URL) is not supported yet: {shown!r}"
        )
    if parts.path not in ("", "/"):
        raise ConfigurationError(f"an etcd URL has no path, got {parts.path!r} in {shown!r}")
    endpoints: list[tuple[str, int]] = []
    for item in netloc.split(","):
        host, port = _host_port(unquote(item), shown)
        endpoints.append((host, port))
    query = parse_query(url, _OPTIONS, what="etcd://")
    ours = dict(query.ours)
    ours.update(options)
    tls = parts.scheme.lower() == "etcds"
    if not tls and any(name in ours for name in ("ca", "cert", "key")):
        raise ConfigurationError(f"ca, cert and key are options of etcds:// (TLS), in {shown!r}")
    if ("cert" in ours) != ("key" in ours):
        raise ConfigurationError(f"cert and key go together, in {shown!r}")
    ours["tls"] = tls
    return endpoints, ours


def _host_port(item: str, shown: str) -> tuple[str, int]:
    if not item:
        raise ConfigurationError(f"an etcd URL needs host:port for every member, in {shown!r}")
    if item.startswith("["):
        host, _, rest = item[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port_text = item.rpartition(":") if ":" in item else (item, "", "")
    try:
        port = int(port_text) if port_text else _DEFAULT_PORT
    except ValueError:
        raise ConfigurationError(f"bad port {port_text!r} in {shown!r}") from None
    if not host or not 0 < port < 65536:
        raise ConfigurationError(f"bad etcd endpoint {item!r} in {shown!r}")
    return host, port


def _target(endpoints: list[tuple[str, int]]) -> tuple[str, str | None]:
    """A gRPC target naming every endpoint, and the TLS name to check (the first host)."""
    addresses: list[str] = []
    for host, port in endpoints:
        try:
            ip = ipaddress.ip_address(host)
            found = [(ip.version, str(ip))]
        except ValueError:
            try:
                infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                raise BackendUnavailable(f"cannot resolve etcd host {host!r}: {exc}") from exc
            found = [(6 if info[0] == socket.AF_INET6 else 4, str(info[4][0])) for info in infos]
        for version, address in found:
            addresses.append(f"[{address}]:{port}" if version == 6 else f"{address}:{port}")
    # gRPC's ipv4:/ipv6: targets take a list; a mixed list goes as ipv6 (v4-mapped).
    if all(not a.startswith("[") for a in addresses):
        target = "ipv4:" + ",".join(dict.fromkeys(addresses))
    else:
        target = "ipv6:" + ",".join(
            a if a.startswith("[") else f"[::ffff:{a.rsplit(':', 1)[0]}]:{a.rsplit(':', 1)[1]}"
            for a in dict.fromkeys(addresses)
        )
    first = endpoints[0][0]
    try:
        ipaddress.ip_address(first)
        name = None
    except ValueError:
        name = first
    return target, name


class EtcdChannel:
    """One gRPC channel to every member, its stubs, and error translation."""

    def __init__(
        self,
        endpoints: list[tuple[str, int]],
        *,
        timeout: float,
        tls: bool = False,
        ca: str | None = None,
        cert: str | None = None,
        key: str | None = None,
    ) -> None:
        self.endpoints = endpoints
        self.timeout = timeout
        self.where = ",".join(f"{h}:{p}" for h, p in endpoints)
        self._tls = (tls, ca, cert, key)
        self._channel: grpc.aio.Channel | None = None
        self._stubs: tuple[Any, Any, Any] | None = None

    # The stubs build the channel at first use (nothing is sent until a call).
    @property
    def kv(self) -> Any:
        return (self._stubs or self.open())[0]

    @property
    def lease(self) -> Any:
        return (self._stubs or self.open())[1]

    @property
    def watch(self) -> Any:
        return (self._stubs or self.open())[2]

    def open(self) -> tuple[Any, Any, Any]:
        """Build the channel and its stubs: KV, Lease, Watch."""
        if self._stubs is not None:
            return self._stubs
        _check_not_forked()
        target, name = _target(self.endpoints)
        options: list[tuple[str, Any]] = [
            ("grpc.lb_policy_name", "round_robin"),
            ("grpc.keepalive_time_ms", _KEEPALIVE_MS),
            ("grpc.keepalive_timeout_ms", _KEEPALIVE_TIMEOUT_MS),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            # A dead member is tried again soon after it comes back.
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", 2000),
        ]
        tls, ca, cert, key = self._tls
        if tls:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=Path(ca).read_bytes() if ca else None,
                private_key=Path(key).read_bytes() if key else None,
                certificate_chain=Path(cert).read_bytes() if cert else None,
            )
            if name is not None:
                options.append(("grpc.ssl_target_name_override", name))
            self._channel = grpc.aio.secure_channel(target, credentials, options=options)
        else:
            self._channel = grpc.aio.insecure_channel(target, options=options)
        channel = self._channel
        self._stubs = (rpc.KVStub(channel), rpc.LeaseStub(channel), rpc.WatchStub(channel))
        return self._stubs

    def stub(self, kind: Callable[[Any], Any]) -> Any:
        """Another stub of ``aetcd.rpc`` on the same channel (for ``tenure doctor``)."""
        self.open()
        return kind(self._channel)

    @contextmanager
    def errors(self, op: str) -> Iterator[None]:
        """gRPC's errors (and time-outs) as :class:`BackendUnavailable`, from the original."""
        try:
            yield
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            raise BackendUnavailable(
                f"etcd at {self.where} failed {op}: {code.name if code else 'error'}: "
                f"{exc.details()}"
            ) from exc
        except TimeoutError as exc:
            raise BackendUnavailable(f"etcd at {self.where} did not answer {op} in time") from exc

    async def aclose(self) -> None:
        channel, self._channel, self._stubs = self._channel, None, None
        if channel is not None:
            await channel.close()
