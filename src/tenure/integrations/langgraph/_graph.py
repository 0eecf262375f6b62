"""A compiled LangGraph graph run as a :class:`~tenure.ThreadRuntime` handler.

For each signal the thread's owner streams the graph with the thread's config
(``thread_id``: the thread's key, ``fencing_token``: the run's token) and
appends what it streams to the thread's output, where any process reads it
(``runtime.follow``, ``runtime.reply``). The signal's id is LangGraph's
``run_id`` (the checkpoints' metadata): a signal delivered again after its
owner died resumes from the last checkpoint its first delivery wrote instead
of applying its input twice (and one whose earlier delivery finished, while
later signals ran, is not run again), and a rollback finds the checkpoints to
remove.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, get_args

from langchain_core.messages import BaseMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.types import Command, Durability, Interrupt, StreamMode
from pydantic import BaseModel

from ..._errors import ConfigurationError, InvalidArgument
from ._fence import fenced_config, fencing_token

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langgraph.pregel import Pregel

    from ...runtime import Signal, ThreadRun

__all__ = ["RESUME", "GraphHandler", "graph_handler", "resume"]

#: The key of a signal payload that resumes an ``interrupt()``: see :func:`resume`.
RESUME = "__resume__"

_MODES = frozenset(get_args(StreamMode))


def resume(value: Any) -> dict[str, Any]:
    """The payload of a signal that resumes the thread's pending ``interrupt()`` with ``value``.

    Send it from any process (``runtime.send_signal(thread, resume("yes"))``):
    the thread's owner runs the graph with ``Command(resume=value)``.
    """
    return {RESUME: value}


def _input(payload: Any) -> Any:
    """The graph's input for a signal's payload: a resume, or the payload itself."""
    if isinstance(payload, dict) and set(payload) == {RESUME}:
        return Command(resume=payload[RESUME])
    return payload


def merged_input(inputs: Sequence[Any]) -> Any | None:
    """One graph input for the inputs of a signal and those coalesced into it
    (oldest first), or ``None`` when they cannot be merged (one is not a mapping:
    a resume, or what a custom ``input`` made).

    A key whose every value is a list (or tuple) gets them all, concatenated in
    order, so a reducer that appends (``add_messages``, ``operator.add``) sees
    every message; any other key takes the newest value, as applying the inputs
    one after another would leave it.
    """
    if not all(isinstance(i, Mapping) for i in inputs):
        return None
    merged: dict[Any, Any] = {}
    for one in inputs:
        for key, value in one.items():
            before = merged.get(key)
            if isinstance(before, list) and isinstance(value, list | tuple):
                merged[key] = [*before, *value]
            else:
                merged[key] = list(value) if isinstance(value, tuple) else value
    return merged


def jsonable(value: Any) -> Any:
    """``value`` as JSON (messages, pydantic models and dataclasses by their fields)."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, Interrupt):
        return {"value": jsonable(value.value), "id": value.id}
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    return repr(value)


def _token_of(chunk: Any) -> dict[str, Any]:
    """A ``messages`` chunk (the message so far, its metadata), compact: one model token."""
    message, metadata = chunk
    item: dict[str, Any] = {"content": jsonable(getattr(message, "content", message))}
    if isinstance(message, BaseMessage):
        item["id"] = message.id
        item["type"] = message.type
    if isinstance(metadata, Mapping) and "langgraph_node" in metadata:
        item["node"] = metadata["langgraph_node"]
    return item


class _Batches:
    """A run's output, written behind the graph: what the graph streams while an
    append is under way goes in the next one (``append_many`` per kind), so a
    model's tokens do not wait for each other's fenced writes, in order."""

    def __init__(self, run: ThreadRun) -> None:
        self._run = run
        self._waiting: list[tuple[str, Any]] = []
        self._writer: asyncio.Task[None] | None = None

    def put(self, kind: str, data: Any) -> None:
        """Queue an item; raises what the last write raised (``Fenced``: stop)."""
        if self._writer is not None and self._writer.done():
            self._writer.result()
        self._waiting.append((kind, data))
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._write())

    async def _write(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            for kind, items in itertools.groupby(batch, key=operator.itemgetter(0)):
                await self._run.append_many([data for _, data in items], kind)
        self._writer = None

    async def flush(self) -> None:
        """Wait until every queued item is written; raises what a write raised."""
        if self._writer is not None:
            await asyncio.shield(self._writer)

    def cancel(self) -> None:
        """Stop writing (the run is cancelled, or failed on what the graph raised)."""
        writer = self._writer
        if writer is None:
            return
        if not writer.done():
            writer.cancel()
        elif not writer.cancelled():
            writer.exception()  # seen: the run ends on its own error


class GraphHandler:
    """Runs a compiled graph for each signal of a thread (make it with :func:`graph_handler`).

    Call it as the runtime's handler, and give the runtime its
    :meth:`on_rollback` for the ``rollback`` policy::

        agent = graph_handler(graph)
        ThreadRuntime(backend, agent, output=True, on_rollback=agent.on_rollback)
    """

    def __init__(
        self,
        graph: Pregel[Any, Any, Any, Any],
        stream_mode: Sequence[StreamMode],
        config: RunnableConfig | None,
        input: Callable[[Any], Any],
        durability: Durability,
    ) -> None:
        self.graph = graph
        self.stream_mode = tuple(stream_mode)
        self.config = config
        self.input = input
        self.durability = durability
        # A thread's interrupted run in this process, until its rollback or the
        # thread's next run: thread -> (run, the signal it was handling, its token).
        self._interrupted: dict[str, tuple[str, str, int | None]] = {}

    def config_for(self, run: ThreadRun, signal: Signal) -> RunnableConfig:
        """The config the graph runs ``signal`` with: the thread, the token, ``run_id``."""
        config = fenced_config(run, self.config)
        metadata = dict(config.get("metadata") or {})
        metadata["run_id"] = signal.id
        config["metadata"] = metadata
        return config

    async def __call__(self, run: ThreadRun) -> None:
        # A rollback comes before the thread's next run, or never (an interrupt).
        self._interrupted.pop(run.thread_key, None)
        await self._claim(run)
        async for signal in run.signals():
            try:
                await self._run_signal(run, signal)
            except asyncio.CancelledError:
                if run.interrupted:
                    self._interrupted[run.thread_key] = (run.run_id, signal.id, run.token)
                raise

    async def _claim(self, run: ThreadRun) -> None:
        """Fence the thread with the run's token before the graph reads its state, so
        a stale owner's checkpoint cannot land between that read and the run's
        first write (a fenced saver's ``aclaim_thread``; other savers have none)."""
        claim = getattr(self.graph.checkpointer, "aclaim_thread", None)
        if claim is not None:
            with fencing_token(run.token):
                await claim(run.thread_key)

    async def _finished_before(self, run: ThreadRun, signal: Signal) -> bool:
        """Whether an earlier delivery of ``signal`` ran the graph to an end (the
        graph's end, or an ``interrupt()`` waiting for an answer).

        A signal is delivered again when its owner died, or lost its lease, after
        the graph's last checkpoint and before the signal was acknowledged; the
        signals after it may have run by then. LangGraph resumes a run only from
        the thread's newest checkpoint (same ``run_id``): applying the input
        again after another signal's checkpoints would answer the message twice.
        Looked up only for a delivery after the first.
        """
        saver = self.graph.checkpointer
        if signal.attempt <= 1 or not isinstance(saver, BaseCheckpointSaver):
            return False
        config = self.config_for(run, signal)
        # The graph's own checkpoints, not a subgraph's (which carry the run_id too).
        config["configurable"] = {**config.get("configurable", {}), "checkpoint_ns": ""}
        # Closed before the state is read: a saver may hold its connection's lock
        # while its listing is open (the SQLite savers do).
        listing = saver.alist(config, filter={"run_id": signal.id}, limit=1)
        try:
            found = await anext(listing, None)
        finally:
            close = getattr(listing, "aclose", None)  # an async generator's
            if close is not None:
                await close()
        if found is None:
            return False
        snapshot = await self.graph.aget_state(found.config)
        return not snapshot.next or any(task.interrupts for task in snapshot.tasks)

    async def _run_signal(self, run: ThreadRun, signal: Signal) -> None:
        """Run the graph for ``signal`` and those coalesced into it: once, on their
        merged input (:func:`merged_input`), or once each, oldest first, when their
        inputs do not merge."""
        if not signal.coalesced:
            await self._stream(run, signal, self.input(signal.payload))
            return
        signals = [*signal.coalesced, dataclasses.replace(signal, coalesced=())]
        merged = merged_input([self.input(s.payload) for s in signals])
        if merged is not None:
            await self._stream(run, signal, merged)
            return
        for one in signals:
            await self._stream(run, one, self.input(one.payload))

    async def _stream(self, run: ThreadRun, signal: Signal, graph_input: Any) -> None:
        if await self._finished_before(run, signal):
            return
        modes = list(dict.fromkeys((*self.stream_mode, "updates")))
        stream = self.graph.astream(
            graph_input,
            self.config_for(run, signal),
            stream_mode=modes,
            durability=self.durability,
        )
        output = _Batches(run) if run.output is not None else None
        try:
            async for mode, chunk in stream:
                if mode == "updates" and isinstance(chunk, Mapping) and "__interrupt__" in chunk:
                    if output is not None:
                        output.put("interrupt", jsonable(chunk["__interrupt__"]))
                    continue
                if output is None or mode not in self.stream_mode:
                    continue
                output.put(mode, _token_of(chunk) if mode == "messages" else jsonable(chunk))
            if output is not None:
                await output.flush()
        finally:
            if output is not None:
                output.cancel()

    async def on_rollback(self, thread_key: str, run_id: str) -> None:
        """Remove the checkpoints that ``run_id`` wrote for the signal a rollback interrupted.

        Fenced with the interrupted run's token, like its other writes: refused
        (:class:`~tenure.fencing.FenceRefused`) once a newer owner has written
        the thread. The checkpoints are those whose metadata ``run_id`` is the
        interrupted signal's id, with their pending writes.
        """
        found = self._interrupted.get(thread_key)
        if found is None or found[0] != run_id:
            return
        del self._interrupted[thread_key]
        _, signal_id, token = found
        saver = self.graph.checkpointer
        delete = getattr(saver, "adelete_for_run", None)
        with fencing_token(token):
            if delete is not None:
                await delete(thread_key, signal_id)
                return
            if isinstance(saver, BaseCheckpointSaver) and _overrides(saver, "adelete_for_runs"):
                await saver.adelete_for_runs([signal_id])
                return
        raise ConfigurationError(
            f"{type(saver).__name__} cannot remove a run's checkpoints: use a fenced saver "
            "of tenure.integrations.langgraph, or one with adelete_for_runs"
        )


def _overrides(saver: object, name: str) -> bool:
    return getattr(type(saver), name, None) is not getattr(BaseCheckpointSaver, name, None)


def graph_handler(
    graph: Pregel[Any, Any, Any, Any],
    *,
    stream_mode: StreamMode | Iterable[StreamMode] = ("updates", "messages"),
    config: RunnableConfig | None = None,
    input: Callable[[Any], Any] | None = None,
    durability: Durability = "sync",
) -> GraphHandler:
    """A :class:`~tenure.ThreadRuntime` handler that runs ``graph`` for each signal.

    The owner of a thread streams ``graph`` for each of its signals, in order,
    with ``config`` (optional) made the thread's: ``thread_id`` is the thread's
    key, ``fencing_token`` the run's token (so a fenced saver refuses the
    writes of a run that lost the thread), ``metadata["run_id"]`` the signal's
    id. Its input is the signal's payload, or ``Command(resume=value)`` for a
    payload made by :func:`resume`; ``input`` maps a payload otherwise. A
    signal that carries others (``Signal.coalesced``, under the ``coalesce``
    and ``Debounce`` policies) runs the graph once, on their inputs merged,
    oldest first (:func:`merged_input`: lists such as ``messages``
    concatenated, other keys the newest value), so the agent answers once,
    seeing every message; inputs that do not merge (a resume) run one after
    another.

    With a runtime that keeps output (``output=True``) each chunk of the
    ``stream_mode``\\ s goes to the thread's output, its kind the mode's name
    (``"messages"``: ``{"content", "id", "type", "node"}`` per model token;
    the others as JSON), and each ``interrupt()`` the graph stops at as an item
    of kind ``"interrupt"`` (``[{"value", "id"}]``), which any process can
    answer with a :func:`resume` signal.

    A lost lease cancels the handler, which stops the graph at once; the
    signal runs again at the thread's next owner, from the last checkpoint
    (``durability="sync"``, the default, saves each step's checkpoint before the
    next step starts). Raises :class:`~tenure.InvalidArgument` for a graph
    without a checkpointer or an unknown stream mode.
    """
    if getattr(graph, "checkpointer", None) in (None, False, True) or not hasattr(graph, "astream"):
        raise InvalidArgument(
            "graph must be a compiled graph with a checkpointer: builder.compile(checkpointer=saver)"
        )
    modes = (stream_mode,) if isinstance(stream_mode, str) else tuple(stream_mode)
    unknown = [m for m in modes if m not in _MODES]
    if unknown or not modes:
        raise InvalidArgument(
            f"stream_mode must be among {', '.join(sorted(_MODES))}, got {stream_mode!r}"
        )
    if durability not in ("sync", "async", "exit"):
        raise InvalidArgument(f"durability must be 'sync', 'async' or 'exit', got {durability!r}")
    if input is not None and not callable(input):
        raise InvalidArgument(f"input must be callable, got {type(input).__name__}")
    return GraphHandler(graph, modes, config, input or _input, durability)
