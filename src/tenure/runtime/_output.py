"""Replies: a thread's output stream, written by its run under the lease, read from anywhere.

The run appends items (``run.append``); the runtime writes the lifecycle items
itself (:data:`LIFECYCLE`). Every append is *fenced*: the backend stores it only
if the writer's owner and token are the lease's current ones, checked in the
same atomic step as the append (a Lua script, one SQL statement), so a stale
run's items never land and it gets :class:`~tenure.Fenced`. Positions are
``1, 2, 3, ...`` per thread with no gap, so a reader that resumes after the
last position it saw reads the rest exactly once and in order, and knows when
retention cut what it asked for (:class:`~tenure.OutputTruncated`).

The backends' stores (``backends/<name>/_output.py``) keep only
``(position, body)``; this module encodes, decodes and judges.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .._errors import (
    BackendUnavailable,
    ConfigurationError,
    Fenced,
    InvalidArgument,
    OutputTruncated,
    TenureError,
)
from .._pubsub import Event
from ._log import EventSource

if TYPE_CHECKING:
    from ._run import Handler, ThreadRun
    from ._types import SendResult

__all__ = [
    "LIFECYCLE",
    "OutputItem",
    "OutputStore",
    "Outputs",
    "Retention",
    "RunOutput",
    "WriteFence",
    "store_for",
]

logger = logging.getLogger("tenure.runtime")

#: Items the runtime writes itself. ``run_started`` (data: owner, token,
#: process), ``signal_taken``, ``signal_finished``, ``run_ended`` (data: ``end``,
#: one of ``ok``, ``failed``, ``interrupted``, ``cancelled``), ``run_lost``
#: (written by the next owner for a run that stopped without ``run_ended``:
#: killed, paused or cut off; data: its ``run_id``), ``cancel`` (a cancel
#: request reached the run; data: who asked).
LIFECYCLE = frozenset(
    {"run_started", "signal_taken", "signal_finished", "run_ended", "run_lost", "cancel"}
)

#: A cancel request, on a thread's cancel topic (``{"run_id": ..., "by": ...}``).
CANCEL = "tenure.runtime.cancel"

#: Ends after which a signal is not run again: its reply is complete.
_FINAL_ENDS = frozenset({"interrupted"})


@dataclass(frozen=True, slots=True)
class Retention:
    """How much of a thread's output a backend keeps: at most ``max_items``
    items, none older than ``max_age`` seconds (the newest item is always kept,
    so positions never restart)."""

    max_items: int = 10_000
    max_age: float = 24 * 3600.0

    def __post_init__(self) -> None:
        if isinstance(self.max_items, bool) or not isinstance(self.max_items, int):
            raise InvalidArgument(f"max_items must be an int, got {type(self.max_items).__name__}")
        if self.max_items < 1:
            raise InvalidArgument(f"max_items must be at least 1, got {self.max_items}")
        if isinstance(self.max_age, bool) or not isinstance(self.max_age, int | float):
            raise InvalidArgument(f"max_age must be a number, got {type(self.max_age).__name__}")
        if not self.max_age > 0:
            raise InvalidArgument(f"max_age must be positive, got {self.max_age}")


@dataclass(frozen=True, slots=True)
class WriteFence:
    """Who may append: the holder ``owner`` of ``lease_key`` with ``token``."""

    lease_key: str
    owner: str
    token: int | None


@dataclass(frozen=True, slots=True)
class OutputItem:
    """One item of a thread's output.

    ``position`` strictly increases per thread, without gaps. ``run_id`` and
    ``token`` are the writer's (its lease's fencing token); ``signal_id`` the
    signal the item answers (``None`` outside a signal). ``kind`` is the
    writer's (``"token"``, ``"tool"``, ``"final"``, ...) or one of
    :data:`LIFECYCLE`. ``data`` is what was appended (a JSON value, or
    ``bytes``). ``at`` is the writer's wall clock (seconds since the epoch).
    """

    position: int
    thread_key: str
    run_id: str
    token: int | None
    signal_id: str | None
    kind: str
    data: Any
    at: float


class OutputStore(Protocol):
    """What a backend offers to keep output streams (``backends/<name>/_output.py``)."""

    async def append(
        self, stream: str, fence: WriteFence, bodies: Sequence[str], retention: Retention
    ) -> int:
        """Store ``bodies`` at the next positions if ``fence`` holds; the last position.

        Raises :class:`~tenure.Fenced` (nothing stored) when it does not.
        """
        ...

    async def read(self, stream: str, after: int, limit: int) -> tuple[int, list[tuple[int, str]]]:
        """The stream's last position, and up to ``limit`` kept items after ``after``."""
        ...

    async def wait(self, stream: str, after: int, timeout: float) -> list[tuple[int, str]]:
        """Return when an item after ``after`` may exist, or after ``timeout`` seconds;
        with the items after ``after`` when the wait itself read them (else ``[]``)."""
        ...

    async def aclose(self) -> None: ...


# -- encoding: pure ---------------------------------------------------------------------


def encode(
    run_id: str, token: int | None, signal_id: str | None, kind: str, data: Any, at: float
) -> str:
    """One item's body (JSON); ``bytes`` data is carried as base64."""
    doc: dict[str, Any] = {"r": run_id, "t": token, "s": signal_id, "k": kind, "a": at}
    if isinstance(data, bytes | bytearray | memoryview):
        doc["b"] = base64.b64encode(bytes(data)).decode("ascii")
    else:
        doc["d"] = data
    try:
        return json.dumps(doc, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"output data must be JSON-serialisable or bytes: {exc}") from exc


def decode(thread_key: str, position: int, body: str) -> OutputItem:
    doc = json.loads(body)
    data = base64.b64decode(doc["b"]) if "b" in doc else doc.get("d")
    return OutputItem(
        position, thread_key, doc["r"], doc["t"], doc["s"], doc["k"], data, float(doc["a"])
    )


def check_kind(kind: str) -> None:
    if not isinstance(kind, str) or not kind:
        raise InvalidArgument(f"kind must be a non-empty str, got {kind!r}")
    if kind in LIFECYCLE:
        raise InvalidArgument(f"kind {kind!r} is written by the runtime only")


def check_after(after: int) -> None:
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise InvalidArgument(f"after must be a position (an int >= 0), got {after!r}")


def ends_reply(item: OutputItem, signal_id: str) -> bool:
    """Whether ``item`` completes the reply to ``signal_id`` (it will not run again)."""
    if item.signal_id != signal_id:
        return False
    if item.kind == "signal_finished":
        return True
    return (
        item.kind == "run_ended"
        and isinstance(item.data, dict)
        and (item.data.get("end") in _FINAL_ENDS)
    )


# -- which store a backend gets ------------------------------------------------------------


def store_for(backend: object, provider: object) -> OutputStore:
    """A new output store on ``backend`` (closed by its runtime), or ``ConfigurationError``.

    The stores fence with the backend's own lease records: the lease provider
    must be the backend itself. Modules are compared before importing, so no
    driver is imported for a backend that does not use it.
    """
    module = type(backend).__module__
    if provider is backend and module == "tenure.backends.memory":
        from ..backends._memory_output import MemoryOutput
        from ..backends.memory import MemoryPubSub

        if isinstance(backend, MemoryPubSub):
            return MemoryOutput(backend)
    if provider is backend and module.startswith("tenure.backends.sqlite"):
        from ..backends.sqlite import SqlitePubSub
        from ..backends.sqlite._output import SqliteOutput

        if isinstance(backend, SqlitePubSub):
            return SqliteOutput(backend)
    if provider is backend and module.startswith("tenure.backends.redis"):
        from ..backends.redis import RedisStreamsPubSub
        from ..backends.redis._output import RedisOutput

        if isinstance(backend, RedisStreamsPubSub):
            return RedisOutput(backend)
    if provider is backend and module.startswith("tenure.backends.postgres"):
        from ..backends.postgres import PostgresPubSub
        from ..backends.postgres._output import PostgresOutput

        if isinstance(backend, PostgresPubSub):
            return PostgresOutput(backend)
    raise ConfigurationError(
        f"{type(backend).__name__} cannot keep thread output: replies need a backend that "
        "carries events and holds the leases itself (memory, SQLite, Redis, PostgreSQL)"
    )


# -- the writer: one per run ------------------------------------------------------------------


class RunOutput:
    """A run's writer: fenced appends in the order they are made."""

    def __init__(
        self,
        store: OutputStore,
        stream: str,
        fence: WriteFence,
        run_id: str,
        retention: Retention,
        lost: asyncio.Event,
    ) -> None:
        self._lost = lost
        self._store = store
        self._stream = stream
        self._fence = fence
        self._run_id = run_id
        self._retention = retention
        self._lock = asyncio.Lock()  # positions are handed out in the order of the calls
        self.fenced = False
        self.last = 0

    async def write(self, items: Sequence[tuple[str, Any, str | None]]) -> int:
        """Append ``(kind, data, signal_id)`` items; the last position."""
        if self.fenced:
            raise Fenced(self._fence.lease_key, self._fence.owner, "a later run owns the thread")
        now = time.time()
        bodies = [
            encode(self._run_id, self._fence.token, signal, kind, data, now)
            for kind, data, signal in items
        ]
        async with self._lock:
            try:
                self.last = await self._store.append(
                    self._stream, self._fence, bodies, self._retention
                )
            except Fenced:
                self.fenced = True
                raise
        return self.last

    async def _lifecycle(self, step: Callable[[], Awaitable[Any]]) -> None:
        """A write of the runtime's own: retried while the backend is unavailable and
        the lease is held, so an outage does not count as the handler failing (an
        attempt that did land may then show twice)."""
        delay = 0.05
        while True:
            try:
                await step()
                return
            except BackendUnavailable:
                if self._lost.is_set():
                    raise
                logger.warning("output of run %s: backend unavailable, retrying", self._run_id)
            await asyncio.sleep(delay)
            delay = min(2 * delay, 1.0)

    async def start(self, thread_key: str, process_id: str) -> None:
        await self._lifecycle(lambda: self._start(thread_key, process_id))

    async def _start(self, thread_key: str, process_id: str) -> None:
        """``run_started``, after a ``run_lost`` for a previous run that never said it ended."""
        head, tail = await self._store.read(self._stream, 0, 0)
        items: list[tuple[str, Any, str | None]] = []
        if head:
            _, tail = await self._store.read(self._stream, head - 1, 1)
            if tail:
                last = decode(thread_key, *tail[0])
                if last.kind not in ("run_ended", "run_lost") and last.run_id != self._run_id:
                    signal = last.signal_id
                    if last.kind == "signal_finished":
                        signal = None
                    items.append(("run_lost", {"run_id": last.run_id, "token": last.token}, signal))
        owner = {"owner": self._fence.owner, "token": self._fence.token, "process": process_id}
        items.append(("run_started", owner, None))
        await self.write(items)

    async def taken(self, signal_id: str) -> None:
        await self._lifecycle(lambda: self.write([("signal_taken", None, signal_id)]))

    async def finished(self, signal_id: str) -> None:
        """The run is done with ``signal_id`` (written before it is acknowledged)."""
        await self._lifecycle(lambda: self.write([("signal_finished", None, signal_id)]))

    async def ended(self, end: str, current: str | None) -> None:
        """``run_ended``; ``current``, the signal the run held, is finished if the end acks it."""
        items: list[tuple[str, Any, str | None]] = []
        if end == "ok" and current is not None:
            items.append(("signal_finished", None, current))
        items.append(("run_ended", {"end": end}, current))
        await self._lifecycle(lambda: self.write(items))


# -- the runtime's side ---------------------------------------------------------------------


class Outputs:
    """A runtime's replies: the stream of each thread, its writers and its readers."""

    def __init__(
        self,
        store: OutputStore,
        stream_of: Callable[[str], str],
        retention: Retention,
        process_id: str,
        log: EventSource,
        cancel_topic: Callable[[str], str],
        poll: float = 1.0,
    ) -> None:
        self.store = store
        self.stream_of = stream_of
        self.log = log
        self.cancel_topic = cancel_topic
        self.retention = retention
        self.process_id = process_id
        self.poll = poll  # seconds between looks when no wake-up came (a lost one)

    def wrap(self, handler: Handler) -> Handler:
        """``handler`` with its run's output: ``run_started`` before, ``run_ended`` after."""

        async def with_output(run: ThreadRun) -> None:

            fence = WriteFence(run.lease_key, run.owner, run.token)
            out = RunOutput(
                self.store,
                self.stream_of(run.thread_key),
                fence,
                run.run_id,
                self.retention,
                run.lost,
            )
            run.output = out
            await out.start(run.thread_key, self.process_id)
            task = asyncio.current_task()
            requests: list[Any] = []

            async def on_cancel(event: Event) -> None:
                data = event.data if isinstance(event.data, dict) else {}
                if data.get("run_id") != run.run_id or task is None or run.interrupted:
                    return  # meant for another run of the thread: never a later one
                requests.append(data.get("by"))
                run.interrupted = True
                task.cancel()

            topic = self.cancel_topic(run.thread_key)
            await self.log.subscribe(topic, on_cancel)
            end = "ok"
            try:
                await handler(run)
            except asyncio.CancelledError:
                end = "lost" if run.lost.is_set() else "interrupted" if run.interrupted else ""
                if end == "interrupted":
                    if requests:
                        with contextlib.suppress(TenureError):
                            await out.write([("cancel", {"by": requests[0]}, _signal_id(run))])
                    await self._close(out, end, _signal_id(run))
                raise
            except Exception:
                end = "failed"
                raise
            finally:
                if end in ("ok", "failed"):
                    await self._close(out, end, _signal_id(run))
                with contextlib.suppress(TenureError):
                    await self.log.unsubscribe(topic, on_cancel)

        return with_output

    async def _close(self, out: RunOutput, end: str, current: str | None) -> None:
        try:
            await out.ended(end, current)
        except Fenced:
            pass  # the next owner writes run_lost for this run
        except Exception:
            logger.warning("could not write the end of run %s", out._run_id, exc_info=True)

    def follow(self, thread_key: str, after: int = 0) -> AsyncIterator[OutputItem]:
        """Every item of ``thread_key``'s output after position ``after``, as it comes."""
        check_after(after)
        return self._follow(thread_key, self.stream_of(thread_key), after)

    async def _follow(
        self, thread_key: str, stream: str, after: int, batch: int = 256
    ) -> AsyncIterator[OutputItem]:
        while True:
            head, rows = await self.store.read(stream, after, batch)
            if (rows and rows[0][0] > after + 1) or (not rows and head > after):
                first = rows[0][0] if rows else head + 1
                raise OutputTruncated(thread_key, after, first)
            for position, body in rows:
                after = position
                yield decode(thread_key, position, body)
            while not rows:
                # A wait that read what it waited for (a blocking XREAD) saves a read;
                # anything else (a timeout, a gap: maybe truncated) goes back to read.
                rows = await self.store.wait(stream, after, self.poll)
                if not rows or rows[0][0] != after + 1:
                    break
                for position, body in rows:
                    after = position
                    yield decode(thread_key, position, body)
                rows = []

    async def cancel(self, thread_key: str, run_id: str, by: str) -> None:
        """Ask run ``run_id`` of ``thread_key``, wherever it runs, to stop (an interrupt)."""
        await self.log.publish(
            self.cancel_topic(thread_key), Event(CANCEL, {"run_id": run_id, "by": by})
        )

    async def head(self, thread_key: str) -> int:
        head, _ = await self.store.read(self.stream_of(thread_key), 0, 0)
        return head

    def reply(self, result: SendResult, after: int | None = None) -> AsyncIterator[OutputItem]:
        """The items answering ``result``'s signal, until its reply is complete."""
        if result.outcome == "rejected":
            raise InvalidArgument("the signal was rejected (nothing was stored): it has no reply")
        start = result.output_after if after is None else after
        if start is not None:
            check_after(start)
        return self._reply(result.thread_key, result.signal_id, start or 0)

    async def _reply(self, thread_key: str, signal: str, after: int) -> AsyncIterator[OutputItem]:
        async for item in self.follow(thread_key, after):
            if item.signal_id != signal:
                continue
            yield item
            if ends_reply(item, signal):
                return


def _signal_id(run: ThreadRun) -> str | None:
    """The id of the signal ``run`` is handling (``None`` between signals)."""
    from ._run import current_signal

    signal = current_signal(run)
    return None if signal is None else signal.id
