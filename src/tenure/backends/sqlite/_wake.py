"""Wake-ups between the processes that share one SQLite file: Unix datagram sockets.

SQLite tells no connection that another one committed. :class:`WakeChannel` is
the one place where instances of the backend (in any process of the host)
tell each other: the lease half rings after a release, transfer or revoke, the
event half after a publish, and both halves listen through the same socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from pathlib import Path

__all__ = ["FREED", "LOOK", "PUBLISHED", "SAFETY_POLL", "TRANSFERRED", "WakeChannel"]

logger = logging.getLogger("tenure.sqlite")

#: Seconds between the safety polls while wake-ups work: they cover a datagram
#: that was dropped (a full queue) or never sent (a socket not yet listed).
SAFETY_POLL = 0.5

# sockaddr_un.sun_path holds 108 bytes on Linux (104 on macOS), one of them the
# terminating NUL.
_MAX_PATH = 103 if sys.platform == "darwin" else 107
# A listing taken within this long of the directory's mtime may miss an entry
# made in the same timestamp tick (coarse clocks, 1 s or 2 s file systems);
# it is taken again until it is older.
_RACY_NS = 2_000_000_000
_SUFFIX = ".wake"
# Datagrams read per wake-up at most; the rest wake the loop again.
_DRAIN = 64
# Names are at most 1024 bytes (tenure._validate); one byte says what happened.
_MAX_DATAGRAM = 2048

# What a datagram says, in its first byte; the rest is the key or topic (UTF-8).
#: The lease of the key was released or revoked.
FREED = b"f"[0]
#: The lease of the key was transferred (a new owner and token).
TRANSFERRED = b"t"[0]
#: An event was stored on the topic.
PUBLISHED = b"p"[0]
#: Not sent: handed to the receiver after a batch that filled the queue, from
#: which datagrams may have been dropped. Look at the file for what changed.
LOOK = b""


def _queue_length() -> int:
    """How many datagrams a socket's queue holds before sends fail with ``EAGAIN``."""
    try:
        return max(1, int(Path("/proc/sys/net/unix/max_dgram_qlen").read_text()))
    except (OSError, ValueError):
        return 10  # Linux's default; elsewhere a byte limit, at least this many small ones


_QUEUE_LENGTH = _queue_length()

# The wake directories this process has already said are unusable, so the
# warning is logged once per file, not once per instance.
_reported: set[str] = set()
_reported_lock = threading.Lock()


def _nothing(messages: list[bytes]) -> None:
    pass


# The channels listening in this process, for the fork handler below.
_listening: weakref.WeakSet[WakeChannel] = weakref.WeakSet()


def _close_in_child() -> None:
    """In a child made by ``fork()``: close the copies of the parent's listening sockets.

    The parent goes on listening on them. A copy left open here would keep the
    socket of a killed parent bound: sends to it would queue up instead of
    being refused, and it would never be removed. The file is not unlinked:
    it is the parent's. (The backends themselves are closed in the child by
    :mod:`tenure.backends._core`.)
    """
    for channel in list(_listening):
        sock = channel._receiver
        channel._receiver = channel._loop = None
        channel.unavailable = "inherited across fork()"
        if sock is not None:
            sock.close()


os.register_at_fork(after_in_child=_close_in_child)


class WakeChannel:
    """Tell the other instances using a database file that something changed in it.

    **How.** Every instance that waits for others' changes (a lease waiter, a
    subscriber) binds a Unix-domain datagram socket in ``<database>.tenure-wake/``,
    one per instance, named ``<pid>-<random>.wake``, and keeps it until it
    closes. An instance that commits a release, transfer, revoke or publish
    sends one datagram (what happened, and to which key or topic) to every
    other socket in that directory from its worker thread, right after the
    commit and before the caller hears of the result. The receiving event loop
    reads it (``add_reader``: no thread, no timer) and hands the batch it read
    to the backend, which wakes the waiter of that key or the subscribers of
    that topic without reading the file first.

    **Why sockets, not inotify on the WAL.** A datagram is sent only for the
    commits that someone may wait for; an inotify watch on the ``-wal`` file
    fires for every frame any connection writes (renewals, heartbeats,
    acknowledgements, checkpoints), so every waiting process would wake for
    each of them. Datagram sockets also work on macOS, need no ``ctypes``, and
    a dead receiver is detected by the kernel at the next send.

    **Never lost for long, never blocking.** Sends are non-blocking. When a
    receiver's queue is full (``EAGAIN``: stopped, or busy) the datagram is
    dropped; the receiver, reading a full queue's worth at once, then looks at
    the file for what changed instead of trusting the datagrams alone. A
    socket whose process was killed refuses (``ECONNREFUSED``) and is removed
    by the sender that found it; one that vanished (``ENOENT``) is forgotten.
    Senders list the directory again whenever its mtime changed (and while
    that mtime is recent, since a coarse timestamp can hide a second change),
    so a socket bound before its owner's first look is sent to by every commit
    after that look. Whatever else goes missing is caught by the safety poll
    (``PRAGMA data_version`` every :data:`SAFETY_POLL` seconds, run by the
    backend): late, never lost. A socket file removed behind its owner's back
    (a clean-up of the directory) is noticed by that poll (:meth:`check`) and
    bound again under a new name. A child made by ``fork()`` closes its
    copies of the parent's sockets, so a killed parent's socket is refused
    and removed even while its children live. Datagrams are hints: one makes
    an instance look, never decides anything, and a forged one costs a look.

    **One socket per instance,** not per process: each instance listens on
    its own event loop (instances of one process may run on different loops
    and threads), and the instances of one process wake each other the same
    way as those of different processes.

    **Unavailable.** Where the socket cannot be made (no ``AF_UNIX``, a path
    longer than ``sun_path`` allows, a directory that cannot be created or
    written, an event loop without ``add_reader``), :meth:`listen` returns
    ``False``, the reason is logged once per file and process at WARNING,
    and the backend polls at ``poll_interval`` as before.

    Threads: :meth:`listen` and :meth:`close` run on the event loop's thread;
    :meth:`ring`, :meth:`check` and :meth:`close_sender` on the backend's
    worker thread.
    """

    def __init__(self, file: str) -> None:
        self.dir = file + ".tenure-wake"
        self._name()
        self.unavailable: str | None = None  # why listening failed, once tried
        self._receiver: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_wake: Callable[[list[bytes]], None] = _nothing
        self._sender: socket.socket | None = None
        self._peers: list[str] = []
        self._listed: tuple[int, int] | None = None  # (directory mtime, listed at), ns

    def _name(self) -> None:
        self.name = f"{os.getpid()}-{uuid.uuid4().hex[:12]}{_SUFFIX}"
        self.path = os.path.join(self.dir, self.name)

    @property
    def listening(self) -> bool:
        return self._receiver is not None

    # -- receiving, on the event loop ----------------------------------------------------

    def listen(self, on_wake: Callable[[list[bytes]], None]) -> bool:
        """Bind this instance's socket (once) and call ``on_wake`` when rung; whether it works."""
        if self._receiver is not None:
            return True
        if self.unavailable is not None:
            return False
        loop = asyncio.get_running_loop()
        try:
            if not hasattr(socket, "AF_UNIX"):
                raise OSError("this platform has no Unix-domain sockets")
            if len(os.fsencode(self.path)) > _MAX_PATH:
                raise OSError(
                    f"the socket path would be {len(os.fsencode(self.path))} bytes, "
                    f"more than the {_MAX_PATH} bytes a Unix-domain socket address holds"
                )
            os.makedirs(self.dir, exist_ok=True)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        except OSError as exc:
            return self._unavailable(str(exc))
        try:
            sock.setblocking(False)
            sock.bind(self.path)
        except OSError as exc:
            sock.close()
            return self._unavailable(f"cannot bind {self.path!r}: {exc}")
        try:
            loop.add_reader(sock.fileno(), self._readable, sock, on_wake)
        except NotImplementedError:
            sock.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            return self._unavailable(f"the event loop {type(loop).__name__} has no add_reader")
        self._receiver, self._loop, self._on_wake = sock, loop, on_wake
        _listening.add(self)
        return True

    def check(self) -> None:
        """Bind again if the socket file was removed (from the worker thread, now and then)."""
        loop = self._loop
        if loop is None or os.path.exists(self.path):
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to listen for
            loop.call_soon_threadsafe(self._listen_again)

    def _listen_again(self) -> None:
        if self._receiver is None or os.path.exists(self.path):
            return  # closed, or bound again already
        on_wake = self._on_wake
        self.close()
        self._name()
        if self.listen(on_wake):
            on_wake([])  # look now: what was sent meanwhile went nowhere

    def _unavailable(self, reason: str) -> bool:
        self.unavailable = reason
        with _reported_lock:
            first = self.dir not in _reported
            _reported.add(self.dir)
        if first:
            logger.warning(
                "no wake-up sockets for %s (%s): other processes' releases and events "
                "are found by polling instead",
                self.dir,
                reason,
            )
        return False

    @staticmethod
    def _readable(sock: socket.socket, on_wake: Callable[[list[bytes]], None]) -> None:
        messages: list[bytes] = []
        while len(messages) < _DRAIN:
            try:
                messages.append(sock.recv(_MAX_DATAGRAM))
            except OSError:
                break  # drained (BlockingIOError), or closed under us
        if len(messages) >= min(_QUEUE_LENGTH, _DRAIN):
            # The queue was full at some point since the last read, so sends to
            # it may have failed: the batch read since then holds all of it.
            messages.append(LOOK)
        if messages:
            on_wake(messages)

    def close(self) -> None:
        """Stop listening and remove the socket; from the loop's thread, or any once the loop is closed."""
        sock, loop = self._receiver, self._loop
        self._receiver = self._loop = None
        _listening.discard(self)
        if sock is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        if loop is not None and not loop.is_closed():
            loop.remove_reader(sock.fileno())
        sock.close()

    def close_soon(self) -> None:
        """:meth:`close` from any thread (a collected backend), without waiting."""
        loop = self._loop
        if loop is None or loop.is_closed():
            self.close()
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)  # at once: senders stop sending here
        try:
            loop.call_soon_threadsafe(self.close)
        except RuntimeError:
            self.close()  # the loop closed meanwhile

    # -- sending, on the worker thread ---------------------------------------------------

    def ring(self, what: int, name: bytes) -> None:
        """Tell every other listening instance of this file ``what`` happened to ``name``.

        Never blocks, never raises.
        """
        peers = self._list()
        if not peers:
            return
        sender = self._sender
        if sender is None:
            try:
                sender = self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                sender.setblocking(False)
            except OSError:
                return
        message = bytes((what,)) + name
        gone: list[str] = []
        for peer in peers:
            path = os.path.join(self.dir, peer)
            try:
                sender.sendto(message, path)
            except BlockingIOError:
                pass  # its queue is full: it has wake-ups to read already
            except ConnectionRefusedError:
                # Nobody is bound to it: its process died without removing it.
                with contextlib.suppress(OSError):
                    os.unlink(path)
                gone.append(peer)
            except FileNotFoundError:
                gone.append(peer)
            except OSError:
                pass  # e.g. another user's socket we may not write: the safety poll covers it
        if gone:
            self._peers = [p for p in self._peers if p not in gone]

    def _list(self) -> list[str]:
        """The other sockets in the directory; listed again when it changed."""
        try:
            mtime = os.stat(self.dir).st_mtime_ns
        except OSError:
            self._listed = None
            return []
        listed = self._listed
        if listed is None or listed[0] != mtime or listed[1] - mtime < _RACY_NS:
            now = time.time_ns()
            try:
                names = os.listdir(self.dir)
            except OSError:
                return []
            self._peers = [n for n in names if n.endswith(_SUFFIX) and n != self.name]
            self._listed = (mtime, now)
        return self._peers

    def close_sender(self) -> None:
        if self._sender is not None:
            self._sender.close()
            self._sender = None
