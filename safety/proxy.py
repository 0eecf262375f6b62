"""A small asyncio TCP proxy that injects network faults between clients and a server.

Modes (``Proxy.mode``):

- ``pass``: bytes flow both ways.
- ``blackhole``: bytes in both directions are swallowed; new connections are
  accepted and go nowhere. The client sees a hang (a timeout).
- ``drop-reply``: requests are forwarded, replies swallowed. The server applied the
  request but the client never learns it: the ambiguous outcome a lease client
  must report as unknown (P7).
- ``reset``: every connection is closed with a TCP RST, and so is each new one.

A connection that lost bytes can never be trusted again (the protocol stream is
out of step), so leaving ``blackhole`` or ``drop-reply`` resets every connection
that lost something. The proxy listens on 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct

__all__ = ["MODES", "Proxy"]

MODES = ("pass", "blackhole", "drop-reply", "reset")


def _rst(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Conn:
    def __init__(self, client_w: asyncio.StreamWriter) -> None:
        self.client_w = client_w
        self.server_w: asyncio.StreamWriter | None = None
        self.tainted = False
        self.tasks: list[asyncio.Task[None]] = []

    def kill(self) -> None:
        _rst(self.client_w)
        if self.server_w is not None:
            _rst(self.server_w)
        for t in self.tasks:
            t.cancel()


class Proxy:
    """Forward ``127.0.0.1:port`` to ``target_host:target_port`` with injectable faults."""

    def __init__(self, target_host: str, target_port: int, *, listen_port: int = 0) -> None:
        self.target = (target_host, target_port)
        self._listen_port = listen_port
        self._mode = "pass"
        self._conns: set[_Conn] = set()
        self._server: asyncio.Server | None = None
        self._closed = False
        self.connections = 0

    @property
    def port(self) -> int:
        assert self._server is not None, "proxy not started"
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def mode(self) -> str:
        return self._mode

    def set_mode(self, mode: str) -> None:
        """Switch mode; resets connections that ``reset`` or a lossy mode left unusable."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self._mode = mode
        for conn in list(self._conns):
            if mode == "reset" or (mode == "pass" and conn.tainted):
                conn.kill()
                self._conns.discard(conn)

    async def start(self) -> Proxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self._listen_port)
        return self

    async def aclose(self) -> None:
        self._closed = True
        if self._server is not None:
            self._server.close()
        # A connection accepted whose handler has not started yet is known to no
        # one but that handler: let it run, see the proxy closed, and close it
        # (Python 3.11's Server.close leaves accepted connections open).
        await asyncio.sleep(0)
        for conn in list(self._conns):
            conn.kill()
        self._conns.clear()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def __aenter__(self) -> Proxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn = _Conn(client_w)
        if self._mode == "reset" or self._closed:
            conn.kill()
            return
        self._conns.add(conn)
        try:
            if self._mode == "blackhole":
                # Go nowhere; swallow what the client sends until healed (then reset).
                conn.tainted = True
                while await client_r.read(65536):
                    pass
                # The client closed it: close our end too (else it lingers half-open).
                conn.kill()
                return
            try:
                server_r, server_w = await asyncio.open_connection(*self.target)
            except OSError:
                conn.kill()
                return
            conn.server_w = server_w
            up = asyncio.ensure_future(self._pump(client_r, server_w, conn, upstream=True))
            down = asyncio.ensure_future(self._pump(server_r, client_w, conn, upstream=False))
            conn.tasks = [up, down]
            await asyncio.wait(conn.tasks, return_when=asyncio.FIRST_COMPLETED)
            conn.kill()
        except (OSError, asyncio.CancelledError):
            conn.kill()
        finally:
            self._conns.discard(conn)

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        conn: _Conn,
        *,
        upstream: bool,
    ) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                data = await reader.read(65536)
                if not data:
                    return
                mode = self._mode
                if mode == "blackhole" or (mode == "drop-reply" and not upstream):
                    conn.tainted = True
                    continue
                writer.write(data)
                await writer.drain()
