"""Replies: the writer a run appends through, and the readers any process follows.

Every append is fenced by the backend's store (:class:`~tenure._output.OutputStore`);
this room orders a run's writes, writes the lifecycle items, carries cancels to
the run they name, and reads a thread's output or one signal's reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from .._errors import BackendUnavailable, Fenced, InvalidArgument, OutputTruncated, TenureError
from .._output import OutputStore, Retention, WriteFence
from .._pubsub import Event
from ._log import EventSource
from ._output import CANCEL, OutputItem, check_after, decode, encode, ends_reply

if TYPE_CHECKING:
    from ._run import Handler, ThreadRun
    from ._types import SendResult

__all__ = ["Outputs", "RunOutput"]

logger = logging.getLogger("tenure.runtime")


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
