"""``PostgresPubSub``: the lease half and the event half on one database."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

from ..._contract import Capability
from ..._errors import ConfigurationError
from ..._output import OutputStore
from ..._url_options import to_int, to_seconds, to_seconds_or_off
from .._claimed import EventOptions
from ._events import PostgresEvents
from ._leases import _KWARGS, _URL_OPTIONS, PostgresLeaseProvider

__all__ = ["PostgresPubSub"]

_EVENT_OPTIONS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "visibility_timeout": ("visibility_timeout", to_seconds),
    "max_attempts": ("max_attempts", to_int(1)),
    "poll_interval": ("poll_interval", to_seconds),
    "prune_interval": ("prune_interval", to_seconds),
    "retention": ("retention", to_seconds),
    "dedupe_window": ("dedupe_window", to_seconds),
    "group_retention": ("group_retention", to_seconds_or_off),
    "lease_retention": ("lease_retention", to_seconds_or_off),
}
# Retentions: 0 turns them off.
_OFF_ALLOWED = frozenset({"group_retention", "lease_retention"})


def _check_option(name: str, value: Any) -> None:
    if name == "max_attempts":
        if type(value) is not int or value < 1:
            raise ConfigurationError(f"max_attempts must be an int >= 1, got {value!r}")
        return
    seconds = not isinstance(value, bool) and isinstance(value, int | float)
    if name in _OFF_ALLOWED:
        if not seconds or not 0 <= value < math.inf:
            raise ConfigurationError(
                f"{name} must be a finite number of seconds >= 0 (0: off), got {value!r}"
            )
    elif not seconds or not 0 < value < math.inf:
        raise ConfigurationError(f"{name} must be a finite number of seconds > 0, got {value!r}")


def _event_options(values: dict[str, Any]) -> EventOptions:
    for name, value in values.items():
        _check_option(name, value)
    opts = EventOptions(**values)
    if opts.dedupe_window > opts.retention:
        raise ConfigurationError("dedupe_window must be at most retention")
    return opts


class PostgresPubSub(PostgresLeaseProvider, PostgresEvents):
    """Leases and durable pub/sub in one PostgreSQL database (``postgresql://``).

    The lease half is :class:`PostgresLeaseProvider` (its docstring states the
    lease guarantees, the clock, connections, the time limit and PgBouncer).
    This class adds events.

    **Storage.** Three tables next to the lease table (``<table>_events``,
    ``<table>_groups``, ``<table>_claims``), created at the first use of the
    event half in one transaction under the DDL advisory lock, so processes
    may start at once. A publish is one statement: it inserts the event and
    one *claim* row for each consumer group of its topic, and notifies. A
    group's claims are its queue. Not a cursor over event ids: identity
    values are handed out before commit, so an event with a smaller id can
    commit after a reader moved past it, and a cursor would skip it. Events
    published while a topic has no group are not stored. A group created by
    ``subscribe`` receives every event published after it committed.

    **Taking.** Each local group has a fetch loop that takes up to 100 due
    claims at once, oldest first, with ``FOR UPDATE SKIP LOCKED``: members of
    a group (in any process) never wait for each other, and each claim goes to
    one of them. Taking sets the claim's ``visible_at`` to now +
    ``visibility_timeout`` (default 30 s) and counts the attempt; while this
    instance lives it extends its claims every ``visibility_timeout / 3``.
    A take commits without waiting for the WAL flush (``synchronous_commit``
    off for that transaction only): one lost in a server crash leaves its
    claims due, so they are delivered again; publishes and acknowledgements
    commit synchronously.
    Members hand events to their callbacks in event order. A callback that
    returns acknowledges; outcomes are written in batches (one statement of up
    to 1000), each naming the delivery (instance and attempt) it settles, so
    one from a delivery that was reclaimed or taken over changes nothing. A
    callback that raises gets the event again at once, ``attempt`` increased,
    up to ``max_attempts`` (default 5), after which the event is dropped and
    logged at ERROR. A subscriber process that dies (or is paused past the
    timeout) has its claims taken by another member after
    ``visibility_timeout``; ``unsubscribe`` and ``aclose`` hand undelivered
    claims back at once. Delivery is at least once.

    **Wake-ups.** One dedicated ``LISTEN`` connection per instance (outside
    the pool) listens on the lease channel and on the event channel (payload:
    the topic in hex); a publish notifies in its own statement, so members
    elsewhere take the event as soon as it commits, but only when a group of
    the topic had no claim waiting to be taken: on a busy topic the publish
    that stored the waiting claim notified, and a member takes again at once
    after every take that found something (and once more 50 ms after the
    first that found nothing, for a publish that committed just after it
    looked; one whose statement took longer than that waits for the fallback
    poll below). PostgreSQL serialises the commits of notifying transactions,
    so a notification per event would cap the publish rate. ``LISTEN`` needs a
    *session*: a direct connection or a session-pooled one, never PgBouncer
    in transaction pooling mode (pass ``listen_conninfo=`` then). Every
    statement of the event half is a single statement in its own transaction,
    like the lease statements, so the pool itself may sit behind PgBouncer in
    transaction mode. Notifications can be lost (the ``LISTEN`` connection is
    replaced after an error, or after an unanswered ping every 5 s): each
    reconnection wakes every local group, and a slow fallback poll takes due
    claims every ``poll_interval`` seconds (default 1) anyway, which also
    finds redeliveries that came due. So a lost notification delays an event
    by at most ``poll_interval``, and an idle subscriber costs one cheap
    statement per group per ``poll_interval``.

    **Fan-out.** A subscriber without a group gets a private group, deleted
    on ``unsubscribe``, on ``aclose`` or, when its process died, by any other
    instance after ``5 * visibility_timeout`` without a heartbeat. A process
    stopped for that long joins again and misses what was published
    meanwhile (logged at WARNING).

    **Retention.** An event goes with its last claim (when its group
    acknowledges it, in the same statement, or by the pruning every
    ``prune_interval`` seconds, default 10); one a publisher gave an id stays
    for ``dedupe_window`` (default 24 h) for deduplication. Any event older
    than ``retention`` (default 7 days; plus ``dedupe_window`` for one with a
    publisher's id) goes even if unacknowledged, with its claims. Dead
    private groups and expired release-wait registrations are pruned too.
    By default named groups are durable and never pruned: a drained group is
    one row, so a runtime's thread leaves one behind.

    **Group retention.** With ``group_retention`` (seconds, default 0: off),
    the prune also deletes a named group that has had no live member for that
    long (none subscribed, in any process: a member's heartbeat, and each
    join, keep it alive for ``5 * visibility_timeout``) and holds no claim
    (every event published to it was acknowledged). A group subscribed to
    after that is made anew and gets only what is published after it, and a
    publish while the topic has no group is not stored, as for any topic
    without a group; :attr:`forgets_idle_groups` says so, and the thread
    runtime then stores a signal only once a session of its thread has joined
    the group. A process stopped (not heart-beating) for ``5 *
    visibility_timeout`` plus ``group_retention`` joins again and misses what
    was published meanwhile, as a fan-out subscriber does.

    **Lease retention.** A released or expired lease keeps its row, which
    carries the key's fencing token. With ``lease_retention`` (seconds,
    default 0: off), the prune deletes a row whose deadline passed more than
    ``lease_retention`` ago (released or expired; a lease whose deadline is
    ahead on the server clock is never touched, judged inside the statement,
    and an ``acquire`` racing the delete either refreshes the row first, so
    the delete skips it, or waits for the delete and inserts anew), and only
    if its token is below the server time, in microseconds, of that cut.
    Tokens still strictly increase for every key: a new row's token is the
    server time in microseconds at its insert (``acquire.sql``), later than
    the cut, so higher than the deleted token. The caveat: a server clock set
    back by more than ``lease_retention`` (or an ``acquire`` statement held up
    for that long between reading the clock and inserting) could seed a key's
    new row below its deleted token; keep the retention well above any clock
    step (hours, not seconds, in production). ``get_lease`` of a deleted key
    answers ``None``, as for any free key.

    With either retention, an instance that had a subscriber prunes every
    ``prune_interval`` until closed, subscribers or not (without one, only
    while it has subscribers; an instance that never subscribes never prunes).

    **Deduplication** (``DEDUPE``). A publish whose caller set ``event.id``
    stores nothing if an event with that id is kept for the topic, and returns
    that first event (same id, ``created_at`` and data). The check is a unique
    index on (topic, id) in the publishing statement, so two concurrent
    publishes of one id, from any processes, store one event; such a publish
    is retried once after a broken connection (the retry finds the first).

    **Reclaim** (``RECLAIM``). ``reclaim(topic, group)`` makes every claim of
    the named group that a member took and has not acknowledged due at once,
    in one statement (this instance's pending outcomes are written first).
    Members take them before newer events, as one more attempt. Members of
    this instance take at once, others at their next notification or poll;
    a reclaimed member that is still alive stops delivering what it had
    queued at once in this instance, at its next heartbeat elsewhere.

    **Backlog** (``BACKLOG``). ``backlog(prefix, group)`` lists the topics
    starting with ``prefix`` whose named group has claims (unread or not
    acknowledged): one pass over the claims in flight, idle topics cost
    nothing.

    **Fenced takes** (``FENCED_TAKES``). ``subscribe(..., fence=LeaseFence(key,
    owner_prefix))``: each take of that subscription checks, in its own
    statement, that the lease ``key`` is live and held by an owner with that
    prefix, and takes nothing otherwise. Leases and claims live in one
    database, so this is exact: a subscriber whose lease expired (paused, cut
    off, slow to learn of the loss) cannot take what the next holder
    reclaimed, however late its request reaches the server. The thread
    runtime subscribes this way, which keeps per-thread order through stale
    readers.

    **Clock.** Visibility, retention and heartbeats are judged on the lease
    clock ``<schema>.lease_now()`` (``clock_timestamp()``), never on a client's.

    Options (keyword arguments or URL query parameters), besides the lease
    half's: ``visibility_timeout``, ``max_attempts``, ``poll_interval``,
    ``prune_interval``, ``retention``, ``dedupe_window``, ``group_retention``,
    ``lease_retention``.
    """

    capabilities = (
        PostgresLeaseProvider.capabilities | Capability.RUNTIME_LOG | Capability.FENCED_TAKES
    )
    _url_options: ClassVar[dict[str, tuple[str, Callable[[str], Any]]]] = {
        **_URL_OPTIONS,
        **_EVENT_OPTIONS,
    }
    _kwargs: ClassVar[frozenset[str]] = _KWARGS | frozenset(_EVENT_OPTIONS)

    def output_store(self) -> OutputStore:
        """A store of thread output streams on this backend (``ThreadRuntime(output=...)``)."""
        from ._output import PostgresOutput

        return PostgresOutput(self)

    def __init__(self, conninfo: str = "", **options: Any) -> None:
        events = {name: options.pop(name) for name in _EVENT_OPTIONS if name in options}
        lease_retention = events.pop("lease_retention", 0.0)
        _check_option("lease_retention", lease_retention)
        opts = _event_options(events)
        super().__init__(conninfo, **options)
        self._init_events(opts, float(lease_retention))

    def __repr__(self) -> str:
        return super().__repr__().replace("PostgresLeaseProvider(", "PostgresPubSub(", 1)

    async def aclose(self) -> None:
        """Stop delivery, hand back taken events, close the pool and the LISTEN connection."""
        if self._closed:
            return
        self._closed = True
        await self._close_events()
        await self._conn.aclose()
        self._waiters.wake_all()
