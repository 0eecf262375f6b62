"""What every fenced saver shares: where a write's token comes from, and the
wrapping of the write methods that the saver it extends implements.

A wrapped write records what it must fence (the threads it writes and its
token) in a context variable, then runs the saver's own method; the hook in
the saver's transaction (the connection's commit on SQLite, the cursor's
pipeline on PostgreSQL) reads it there and runs the fence's check. Reads run
with nothing recorded and are never checked.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from langgraph.checkpoint.base import BaseCheckpointSaver

from ..._errors import ConfigurationError, InvalidArgument
from ...fencing import FenceRefused, SqlFence

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

    from ...runtime import ThreadRun

__all__ = ["FENCING_TOKEN", "Pending", "fence_writes", "fenced_config", "fencing_token"]

#: The token of writes whose config carries none (``delete_thread``, ``prune``,
#: ``copy_thread`` take no config). Set it with :func:`fencing_token`.
FENCING_TOKEN: ContextVar[int | None] = ContextVar("tenure_fencing_token", default=None)

CONFIG_KEY = "fencing_token"


@contextmanager
def fencing_token(token: int | None) -> Iterator[None]:
    """Within the block, fenced writes without a token in their config carry ``token``.

    Tasks started in the block inherit it, as do the calls a saver's sync
    methods hand to its event loop.
    """
    reset = FENCING_TOKEN.set(token)
    try:
        yield
    finally:
        FENCING_TOKEN.reset(reset)


def fenced_config(run: ThreadRun, config: RunnableConfig | None = None) -> RunnableConfig:
    """``config`` for ``run``'s thread: ``thread_id`` is the thread's key and
    ``fencing_token`` the run's token, so every checkpoint write the graph
    makes is refused once a newer owner of the thread has written."""
    base: dict[str, Any] = dict(config or {})
    configurable = dict(base.get("configurable") or {})
    configurable["thread_id"] = run.thread_key
    configurable[CONFIG_KEY] = run.token
    base["configurable"] = configurable
    return base  # type: ignore[return-value]  # RunnableConfig is a TypedDict of these keys


@dataclass(slots=True)
class Pending:
    """The fence a write in progress must pass: its threads and its token.

    The hook that runs the check sets ``checked``: a write that ends without
    it went by a path the fenced saver does not know (a saver version it was
    not made for), which is reported instead of passing silently.
    """

    keys: tuple[str, ...]
    token: int
    checked: bool = False
    # Set by a saver's connection at the write's first statement (see _sqlite.py).
    started: bool = False

    @property
    def shown(self) -> str:
        return ", ".join(self.keys)


PENDING: ContextVar[Pending | None] = ContextVar("tenure_pending_fence", default=None)


@contextmanager
def no_fence() -> Iterator[None]:
    """Within the block, the saver's statements run unchecked (its own set-up)."""
    reset = PENDING.set(None)
    try:
        yield
    finally:
        PENDING.reset(reset)


def _token(config: Mapping[str, Any] | None) -> int | None:
    configurable = (config or {}).get("configurable") or {}
    if CONFIG_KEY in configurable:
        token: int | None = configurable[CONFIG_KEY]
        return token
    return FENCING_TOKEN.get()


def _arg(args: Sequence[Any], kwargs: Mapping[str, Any], index: int, name: str) -> Any:
    return args[index] if len(args) > index else kwargs.get(name)


def _of_config(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[list[str], int | None]:
    config = _arg(args, kwargs, 0, "config") or {}
    return [str((config.get("configurable") or {}).get("thread_id"))], _token(config)


def _of_thread(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[list[str], int | None]:
    return [str(_arg(args, kwargs, 0, "thread_id"))], FENCING_TOKEN.get()


def _of_target(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[list[str], int | None]:
    return [str(_arg(args, kwargs, 1, "target_thread_id"))], FENCING_TOKEN.get()


def _of_threads(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[list[str], int | None]:
    ids = _arg(args, kwargs, 0, "thread_ids")
    if isinstance(ids, str) or ids is None:
        return [], FENCING_TOKEN.get()  # the saver's own method rejects it
    return sorted({str(i) for i in ids}), FENCING_TOKEN.get()


Locate = Callable[[Sequence[Any], Mapping[str, Any]], tuple[list[str], int | None]]

# Each write LangGraph's savers may implement, and what it writes. A write not
# tied to threads (delete_for_runs) cannot be fenced by thread: it is refused.
WRITES: dict[str, Locate | None] = {
    "put": _of_config,
    "put_writes": _of_config,
    "delete_thread": _of_thread,
    "delete_for_run": _of_thread,
    "claim_thread": _of_thread,
    "copy_thread": _of_target,
    "prune": _of_threads,
    "delete_for_runs": None,
}


def _pending(name: str, locate: Locate | None, args: Any, kwargs: Any) -> Pending | None:
    if locate is None:
        raise ConfigurationError(
            f"{name} is refused by a fenced saver: it writes to runs of any thread, "
            "which no thread's token can fence"
        )
    keys, token = locate(args, kwargs)
    if not keys:
        return None
    if token is None:
        raise FenceRefused(", ".join(keys), None, None)
    if isinstance(token, bool) or not isinstance(token, int):
        raise InvalidArgument(
            f"config['configurable']['{CONFIG_KEY}'] must be an int (the lease's fencing "
            f"token), got {type(token).__name__}"
        )
    outer = PENDING.get()
    if outer is not None and (outer.keys, outer.token) == (tuple(keys), token):
        return outer  # a sync bridge's call of the async write: one write, one check
    return Pending(tuple(keys), token)


def _checked(pending: Pending | None, saver: object) -> None:
    if pending is not None and not pending.checked:
        raise ConfigurationError(
            f"{type(saver).__name__} wrote {pending.shown!r} without running the fence's check: "
            "this version of the LangGraph saver writes in a way it was not made for "
            "(see the versions that tenure[langgraph] supports)"
        )


def _translated(exc: Exception, pending: Pending | None) -> FenceRefused | None:
    if pending is None or isinstance(exc, FenceRefused | ConfigurationError):
        return None
    return SqlFence.refusal(exc, pending.shown, pending.token)


@contextmanager
def _writing(name: str, locate: Locate | None, args: Any, kwargs: Any) -> Iterator[Pending | None]:
    """Record what a write must fence for its run, and turn what the database says
    when the fence refuses it into :class:`FenceRefused`."""
    pending = _pending(name, locate, args, kwargs)
    reset = PENDING.set(pending)
    try:
        yield pending
    except Exception as exc:
        refused = _translated(exc, pending)
        if refused is None:
            raise
        raise refused from None
    finally:
        PENDING.reset(reset)


def _wrap(name: str, locate: Locate | None, impl: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(impl):

        @functools.wraps(impl)
        async def awrite(self: Any, *args: Any, **kwargs: Any) -> Any:
            with _writing(name, locate, args, kwargs) as pending:
                result = await impl(self, *args, **kwargs)
                _checked(pending, self)
                return result

        return awrite

    @functools.wraps(impl)
    def write(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _writing(name, locate, args, kwargs) as pending:
            result = impl(self, *args, **kwargs)
            _checked(pending, self)
            return result

    return write


S = TypeVar("S", bound=type[BaseCheckpointSaver[Any]])


def fence_writes(cls: S) -> S:
    """Wrap each write method (sync and async) that ``cls``'s saver implements.

    Only those: a method the saver leaves to ``BaseCheckpointSaver`` stays as
    it is, so the fenced saver declares exactly the saver's capabilities (the
    conformance suite detects them by which methods are overridden).
    """
    for name, locate in WRITES.items():
        for method in (name, f"a{name}"):
            impl = getattr(cls, method, None)
            if impl is None or impl is getattr(BaseCheckpointSaver, method, None):
                continue
            setattr(cls, method, _wrap(name, locate, impl))
    return cls
