"""Capabilities: what a backend can do beyond the five lease methods (CONTRACT section 3).

Apart from :mod:`tenure._contract` so that the pub/sub layer, which the
contract's protocols name, can read them without importing the contract.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

__all__ = ["Capability", "capabilities_of"]


class Capability(enum.Flag):
    """What a backend can do beyond the five lease methods, declared up front.

    A backend declares them in a class attribute ``capabilities`` (a
    ``Capability``, or an iterable of the member names in lower case for a
    backend that does not import tenure). Holding, the runtime and the
    contract suite read the declaration; they never probe for methods.
    """

    NONE = 0
    #: ``get_lease(key) -> LeaseRecord | None``: owner, token and remaining TTL in one read.
    RECORD = enum.auto()
    #: ``renew_leases(keys, owner, ttl_ms) -> list[bool]``: many renewals in one round trip.
    RENEW_MANY = enum.auto()
    #: ``renew_owned(leases, ttl_ms) -> list[bool]``: renewals of many ``(key, owner)``
    #: pairs, each owner its own, in one round trip (a process renewing what its
    #: holders hold: the thread runtime).
    RENEW_OWNED = enum.auto()
    #: ``wait_lease_released(key, timeout) -> bool``: woken when the holder releases or transfers.
    RELEASE_WAKEUPS = enum.auto()
    #: ``transfer_lease`` is one atomic step (the key is never free in between).
    ATOMIC_TRANSFER = enum.auto()
    #: The pub/sub methods (``publish``, ``subscribe``, ``unsubscribe``, ``flush``).
    EVENTS = enum.auto()
    #: Consumer groups that outlive a process and redeliver what a dead member
    #: never acknowledged, so events reach other processes.
    DURABLE_GROUPS = enum.auto()
    #: ``scan_leases`` and ``revoke_lease``, for operators.
    OPERATIONS = enum.auto()
    #: ``publish`` of an event whose ``id`` was already published on the topic
    #: (within the backend's retention) stores nothing and returns the first one.
    DEDUPE = enum.auto()
    #: ``reclaim(topic, group) -> int``: every event of ``group`` delivered but not
    #: acknowledged (to any member, dead or alive) goes back to the group at once,
    #: and is delivered before any newer event. For a sole consumer elected by a
    #: lease: what its dead predecessor held comes back without a redelivery timeout.
    RECLAIM = enum.auto()
    #: ``backlog(prefix, group) -> list[str]``: the topics starting with ``prefix``
    #: whose ``group`` has events not yet acknowledged (unread or in flight).
    BACKLOG = enum.auto()
    #: ``subscribe(..., fence=LeaseFence(key, owner_prefix))``: a member takes
    #: events only while that lease is held by an owner with that prefix,
    #: checked in the same transaction as the take (a stale reader takes nothing).
    FENCED_TAKES = enum.auto()

    #: Every lease extension: what each of tenure's own backends declares.
    LEASES = RECORD | RENEW_MANY | RELEASE_WAKEUPS | ATOMIC_TRANSFER
    #: What the thread runtime needs of a log shared by processes.
    RUNTIME_LOG = EVENTS | DURABLE_GROUPS | DEDUPE | RECLAIM | BACKLOG


def capabilities_of(backend: object) -> Capability:
    """The capabilities ``backend`` declares (``Capability.NONE`` when it declares none)."""
    declared = getattr(type(backend), "capabilities", None)
    if declared is None:
        declared = getattr(backend, "capabilities", None)
    if isinstance(declared, Capability):
        return declared
    if declared is None or isinstance(declared, str | bytes):
        return Capability.NONE
    result = Capability.NONE
    if isinstance(declared, Iterable):
        for name in declared:
            member = Capability.__members__.get(str(name).upper())
            if member is not None:
                result |= member
    return result
