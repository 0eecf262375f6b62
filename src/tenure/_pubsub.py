"""The event-delivery contract (CONTRACT section 6): ``PubSub`` and ``Event``."""

from __future__ import annotations

import abc
import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

from ._capabilities import Capability
from ._errors import InvalidArgument
from ._lifecycle import AsyncCloseable
from ._validate import check_name, check_text, check_time

__all__ = [
    "Callback",
    "Event",
    "LeaseFence",
    "PubSub",
    "call_back",
    "check_backlog",
    "check_callback",
    "check_data",
    "check_group",
    "check_publish",
    "check_subscribe",
    "join_slot",
    "prepare_event",
    "remove_member",
]


@dataclass(frozen=True, slots=True)
class Event:
    """One event on a topic.

    ``type`` and ``data`` (JSON-serialisable) are the caller's; ``run_id`` ties
    the event to a run. ``id`` and ``created_at`` (seconds since the epoch) are
    set when it is published. ``attempt`` counts deliveries: 1 the first time,
    higher when an earlier delivery raised or its subscriber died.
    """

    type: str
    data: Any = None
    run_id: str | None = None
    id: str | None = None
    created_at: float | None = None
    attempt: int = field(default=1, compare=False)

    def to_json(self) -> str:
        """The event's fields (without ``attempt``) as a JSON document."""
        return json.dumps(
            {
                "type": self.type,
                "data": self.data,
                "run_id": self.run_id,
                "id": self.id,
                "created_at": self.created_at,
            },
            separators=(",", ":"),
            ensure_ascii=False,
        )

    @classmethod
    def from_json(cls, text: str | bytes, attempt: int = 1) -> Event:
        doc = json.loads(text)
        return cls(
            type=doc["type"],
            data=doc["data"],
            run_id=doc["run_id"],
            id=doc["id"],
            created_at=doc["created_at"],
            attempt=attempt,
        )


Callback = Callable[[Event], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class LeaseFence:
    """Take events for a subscription only while ``key`` is held by an owner
    starting with ``owner_prefix`` (``Capability.FENCED_TAKES``).

    The backend checks the lease in the same transaction that takes the events,
    so a subscriber whose lease is gone takes nothing, however late its request
    reaches the server: what the lease's next holder reclaimed, or is about to
    read, stays for that holder. A prefix, not one owner, so that the lease can
    move between owners of the same subscriber (the runtime's runs of one
    session) without fencing it out.
    """

    key: str
    owner_prefix: str

    def __post_init__(self) -> None:
        check_name(self.key, "fence.key")
        if not isinstance(self.owner_prefix, str) or not self.owner_prefix:
            raise InvalidArgument("fence.owner_prefix must be a non-empty str")
        try:
            self.owner_prefix.encode()
        except UnicodeEncodeError:
            raise InvalidArgument("fence.owner_prefix must be encodable as UTF-8") from None


def check_data(value: Any, arg: str) -> None:
    """Raise :class:`InvalidArgument` unless ``value`` can be stored as an event's
    data: JSON-serialisable, and its JSON encodable as UTF-8 (no lone surrogate)."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(
            f"{arg} must be encodable as UTF-8 (it contains a lone surrogate)"
        ) from None
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidArgument(f"{arg} must be JSON-serialisable: {exc}") from None


def prepare_event(event: Any) -> Event:
    """Validate ``event`` and give it an ``id`` and ``created_at`` if it has none.

    ``type``: a non-empty str; ``id`` and ``run_id``: ``None`` or a valid name
    (see :func:`~tenure._validate.check_name`); ``data``: see :func:`check_data`;
    ``created_at``: ``None`` or a finite number of seconds. Nothing else is
    accepted, on any backend, and nothing is sent before these checks.
    """
    if not isinstance(event, Event):
        raise InvalidArgument(f"event must be a tenure.Event, got {type(event).__name__}")
    check_text(event.type, "event.type")
    if event.id is not None:
        check_name(event.id, "event.id")
    if event.run_id is not None:
        check_name(event.run_id, "event.run_id")
    check_data(event.data, "event.data")
    # Built directly: dataclasses.replace costs several times more, on every publish.
    return Event(
        event.type,
        event.data,
        event.run_id,
        event.id or uuid.uuid4().hex,
        time.time()
        if event.created_at is None
        else check_time(event.created_at, "event.created_at"),
    )


class _Members(Protocol):
    workers: dict[Callback, asyncio.Task[None]]


_K = TypeVar("_K")
_G = TypeVar("_G", bound=_Members)


def join_slot(
    topics: dict[str, dict[Any, _G]], topic: str, callback: Callback, group: str | None
) -> tuple[dict[Any, _G], str | Callback]:
    """What ``subscribe`` checks first: a topic's groups and the slot ``callback`` joins.

    The slot is the group's name, or the callback itself for a fan-out
    subscriber (a private group of one). A callback subscribed to the topic
    already is refused.
    """
    groups = topics.setdefault(topic, {})
    if any(callback in g.workers for g in groups.values()):
        raise InvalidArgument(f"callback is already subscribed to topic {topic!r}")
    return groups, (callback if group is None else group)


async def remove_member(groups: dict[_K, _G], callback: Callback) -> list[tuple[_K, _G]]:
    """Stop ``callback``'s delivery task in the group of a topic it belongs to.

    Returns the groups it leaves without a member, for the backend to forget or keep.
    """
    emptied: list[tuple[_K, _G]] = []
    for slot, target in list(groups.items()):
        task = target.workers.pop(callback, None)
        if task is None:
            continue
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if not target.workers:
            emptied.append((slot, target))
    return emptied


async def call_back(callback: Callback, event: Event) -> BaseException | None:
    """Deliver ``event`` to ``callback``: ``None`` if it returned, else what it raised.

    A ``CancelledError`` is the callback's failure like any other exception,
    unless the task running it was asked to stop (``Task.cancel``, as tenure
    does to unsubscribe or close): only then does it propagate. A callback that
    awaits a task someone else cancelled must not end its subscription.
    """
    try:
        await callback(event)
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise
        return exc
    except Exception as exc:
        return exc
    return None


def check_callback(callback: Any) -> Callback:
    if not callable(callback):
        raise InvalidArgument(f"callback must be callable, got {type(callback).__name__}")
    return callback  # type: ignore[no-any-return]


def check_group(group: Any) -> str | None:
    return None if group is None else check_name(group, "group")


def check_publish(topic: Any, event: Any) -> tuple[Event, bool]:
    """The arguments of ``publish``: the event to store (:func:`prepare_event`), and
    whether its ``id`` is the caller's (a publish with a kept id stores nothing)."""
    check_name(topic, "topic")
    return prepare_event(event), event.id is not None


def check_subscribe(topic: Any, callback: Any, group: Any, fence: Any = None) -> None:
    """The arguments of ``subscribe``."""
    check_name(topic, "topic")
    check_callback(callback)
    check_group(group)
    if fence is not None and not isinstance(fence, LeaseFence):
        raise InvalidArgument(f"fence must be a tenure.LeaseFence, got {type(fence).__name__}")


def check_backlog(prefix: Any, group: Any) -> None:
    """The arguments of ``backlog``."""
    if not isinstance(prefix, str):
        raise InvalidArgument(f"prefix must be a str, got {type(prefix).__name__}")
    check_name(group, "group")


class PubSub(AsyncCloseable, abc.ABC):
    """Publish events to topics; deliver them to subscribers.

    Without a ``group`` every subscriber gets every event (fan-out). Subscribers
    that share a ``group`` compete: each event goes to one of them. A callback
    that returns acknowledges the event; one that raises gets it redelivered,
    up to the backend's ``max_attempts``, after which it is dropped and logged.

    A subclass whose groups outlive a process and redeliver what a dead member
    never acknowledged declares ``Capability.DURABLE_GROUPS`` as well.
    """

    capabilities: ClassVar[Capability] = Capability.EVENTS

    @abc.abstractmethod
    async def publish(self, topic: str, event: Event) -> Event:
        """Publish ``event`` on ``topic``; returns it with ``id`` and ``created_at`` set."""

    @abc.abstractmethod
    async def subscribe(self, topic: str, callback: Callback, *, group: str | None = None) -> None:
        """Deliver events published on ``topic`` from now on to ``callback``."""

    @abc.abstractmethod
    async def unsubscribe(self, topic: str, callback: Callback) -> None:
        """Stop delivering ``topic`` to ``callback`` (no error if it was not subscribed)."""

    @abc.abstractmethod
    async def flush(self) -> None:
        """Wait until every event published so far has been handled by local subscribers."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Stop delivery and release every resource; later calls raise ``BackendClosed``."""
