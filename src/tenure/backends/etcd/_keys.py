"""One backend's view of its keys on etcd: read, decide, apply in one transaction.

:class:`EtcdKeys` is the only place that sends lease changes: a decision
taken on a state read (or remembered) is applied with a transaction that
compares the key's ``mod_revision`` with the one it was taken on; a
transaction whose compare fails writes nothing and returns the new state,
and the decision is taken again. It also keeps the etcd leases that clean
up forgotten keys, and the last state it wrote per key (a renew or release
of it needs no read first).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, NamedTuple, TypeVar

from ..._errors import BackendUnavailable
from .._core import holds
from ._connection import EtcdChannel, rpc

__all__ = [
    "GRANT_TOKEN",
    "LEADER_ONLY",
    "TRANSFER_TOKEN",
    "Applied",
    "EtcdKeys",
    "Lease",
    "Seen",
    "Write",
    "decode",
    "delete",
    "ms_of",
    "seen_of",
    "wall_ms",
]

R = TypeVar("R")

# A decision that found the key changed under it is taken again on the new
# state; this many changes in a row mean a storm of writers on one key.
MAX_TRIES = 64
# How many keys' last written state a backend remembers (to skip a read).
_REMEMBERED = 65536
# Operations per etcd transaction (etcd's --max-txn-ops is 128 by default).
_BATCH = 100
# An etcd lease (the clean-up of forgotten keys) must outlive every deadline
# attached to it by this much (a margin for the server's clock rate).
_GC_MARGIN_S = 0.5
_CREATE, _MOD = rpc.Compare.CompareTarget.CREATE, rpc.Compare.CompareTarget.MOD
_EQUAL = rpc.Compare.CompareResult.EQUAL
LEADER_ONLY = (("hasleader", "true"),)


class Seen(NamedTuple):
    """A key's value and ``mod_revision`` as read (or written) in one step."""

    value: bytes
    mod_revision: int


class Lease(NamedTuple):
    owner: str
    token: int
    deadline_ms: int


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def ms_of(clock: Callable[[], float]) -> Callable[[], int]:
    return lambda: int(clock() * 1000)


# The token field of a new owner's write: its token is the mod_revision of that
# very write. "00" marks a transfer, which wakes a waiter (a grant does not).
GRANT_TOKEN, TRANSFER_TOKEN = b"0", b"00"


def _encode(token: int | bytes, deadline_ms: int, owner: str) -> bytes:
    head = token if isinstance(token, bytes) else b"%d" % token
    return head + b":%d:" % deadline_ms + owner.encode("utf-8")


def decode(seen: Seen) -> Lease | None:
    token, _, rest = seen.value.partition(b":")
    deadline, _, owner = rest.partition(b":")
    try:
        number = int(token)
        return Lease(owner.decode("utf-8"), number or seen.mod_revision, int(deadline))
    except ValueError:
        return None  # not written by tenure


def delete(name: bytes) -> Any:
    return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=name))


def _lease_gone(exc: BackendUnavailable) -> bool:
    """Whether a put failed because its clean-up lease had ended (nothing was written)."""
    return "requested lease not found" in str(exc)


class Write:
    """A put of a lease, built just before it is sent (its deadline counts from then)."""

    __slots__ = ("name", "owner", "token", "ttl_ms", "value")

    #: The token this write keeps (a renewal, a same-owner re-acquire), or
    #: ``GRANT_TOKEN``/``TRANSFER_TOKEN``: a new owner, whose token is the
    #: revision of the write itself.
    token: int | bytes

    def __init__(self, name: bytes, owner: str, token: int | bytes, ttl_ms: int) -> None:
        self.name, self.owner, self.token, self.ttl_ms = name, owner, token, ttl_ms
        self.value = b""

    def kept_token(self, revision: int) -> int:
        """The fencing token of this write once applied at ``revision``."""
        return self.token if isinstance(self.token, int) else revision

    def op(self, gc_lease: int, now_ms: int) -> Any:
        self.value = _encode(self.token, now_ms + self.ttl_ms, self.owner)
        return rpc.RequestOp(
            request_put=rpc.PutRequest(key=self.name, value=self.value, lease=gc_lease)
        )


def seen_of(kvs: Any) -> Seen | None:
    """The state in a range reply's ``kvs`` (``None``: no key)."""
    return Seen(kvs[0].value, kvs[0].mod_revision) if kvs else None


class Applied(NamedTuple, Generic[R]):
    """What :meth:`EtcdKeys.change` did: the decision's result, the revision of
    its write (0 if none) and the operation applied (``None`` if none)."""

    result: R
    revision: int
    action: Any


Decide = Callable[[Lease | None, int], tuple[Any, R]]


class EtcdKeys:
    """The keys of one backend on one etcd channel (see the module docstring)."""

    def __init__(
        self,
        channel: EtcdChannel,
        *,
        timeout: float,
        now_ms: Callable[[], int],
        check_open: Callable[[], None],
    ) -> None:
        self.channel = channel
        self._timeout = timeout
        #: The wall clock of the deadlines, in ms.
        self.now_ms = now_ms
        self._check_open = check_open
        # What this backend last wrote per key.
        self._seen: OrderedDict[bytes, Seen] = OrderedDict()
        # etcd leases for clean-up, by length in seconds: (id, local time it may end).
        self._gc: dict[int, tuple[int, float]] = {}
        self._gc_granting: dict[int, asyncio.Future[None]] = {}

    async def call(self, op: str, method: Any, request: Any, **kwargs: Any) -> Any:
        self._check_open()
        with self.channel.errors(op):
            # A member that knows no leader answers at once instead of at the time-out.
            return await method(request, timeout=self._timeout, metadata=LEADER_ONLY, **kwargs)

    async def get(self, op: str, name: bytes) -> Seen | None:
        reply = await self.call(op, self.channel.kv.Range, rpc.RangeRequest(key=name))
        return seen_of(reply.kvs)

    def remembered(self, name: bytes) -> Seen | None:
        return self._seen.get(name)

    def remember(self, name: bytes, seen: Seen | None) -> None:
        if seen is None:
            self._seen.pop(name, None)
            return
        self._seen[name] = seen
        self._seen.move_to_end(name)
        if len(self._seen) > _REMEMBERED:
            self._seen.popitem(last=False)

    async def guess(self, name: bytes) -> tuple[Seen | None, bool]:
        """The state to decide on first, and whether it is only remembered (not read)."""
        seen = self._seen.get(name)
        if seen is not None:
            return seen, True
        return await self.get("read", name), False

    async def change(
        self,
        op: str,
        name: bytes,
        decide: Decide[R],
        *,
        guess: Seen | None,
        guessed: bool,
    ) -> Applied[R]:
        """Decide on the key's state and apply the decision in one transaction.

        ``decide(lease, now_ms)`` returns ``(operation or None, result)``;
        the operation is a :class:`Write` or a delete. ``guess`` is the state
        to try first; when ``guessed`` it was not read from the server, so a
        decision to write nothing is checked by a read.
        """
        seen = guess
        for _ in range(MAX_TRIES):
            lease = None if seen is None else decode(seen)
            action, result = decide(lease, self.now_ms())
            if action is None:
                if guessed:
                    seen, guessed = await self.get(op, name), False
                    continue
                return Applied(result, 0, None)
            reply = await self._txn(op, _compare(name, seen), action, name)
            if reply is None:  # the clean-up lease ended before the write arrived
                continue
            if reply.succeeded:
                return Applied(result, reply.header.revision, action)
            seen, guessed = seen_of(reply.responses[0].response_range.kvs), False
        raise BackendUnavailable(
            f"etcd at {self.channel.where}: the key changed {MAX_TRIES} times while {op} decided"
        )

    async def _txn(self, op: str, compare: Any, action: Any, name: bytes) -> Any:
        write = isinstance(action, Write)
        if isinstance(action, Write):
            action = action.op(await self.gc_lease(action.ttl_ms), self.now_ms())
        request = rpc.TxnRequest(
            compare=[compare],
            success=[action],
            failure=[rpc.RequestOp(request_range=rpc.RangeRequest(key=name))],
        )
        try:
            return await self.call(op, self.channel.kv.Txn, request)
        except BackendUnavailable as exc:
            if write and _lease_gone(exc):
                self._gc.clear()
                return None
            raise

    async def gc_lease(self, ttl_ms: int) -> int:
        """An etcd lease that ends no sooner than ``ttl_ms`` from now (one per length, reused)."""
        seconds = 2 * math.ceil(ttl_ms / 1000) + 1
        loop = asyncio.get_running_loop()
        while True:
            entry = self._gc.get(seconds)
            if entry is not None and loop.time() + ttl_ms / 1000 + _GC_MARGIN_S <= entry[1]:
                return entry[0]
            granting = self._gc_granting.get(seconds)
            if granting is not None:  # one grant at a time per length
                await asyncio.shield(granting)
                continue
            granting = self._gc_granting[seconds] = loop.create_future()
            try:
                sent = loop.time()
                request = rpc.LeaseGrantRequest(TTL=seconds)
                reply = await self.call("LeaseGrant", self.channel.lease.LeaseGrant, request)
                # The server may raise a short TTL to its minimum, never lower it.
                self._gc[seconds] = (int(reply.ID), sent + reply.TTL)
            finally:
                del self._gc_granting[seconds]
                granting.set_result(None)

    # -- many keys at once ---------------------------------------------------------------

    async def renew_many(self, names: list[bytes], owner: str, ttl: int) -> dict[bytes, bool]:
        """Renew ``owner``'s leases of ``names``, 100 per transaction; one bool per name."""
        result = dict.fromkeys(names, False)
        states: dict[bytes, Seen | None] = {name: self._seen.get(name) for name in names}
        fresh = {name: name not in self._seen for name in names}
        unread = [name for name in names if fresh[name]]
        pending = names
        for _ in range(MAX_TRIES):
            if unread:
                states.update(await self._get_many(unread))
                fresh.update(dict.fromkeys(unread, True))
            writes, unread = self._renewals(pending, states, fresh, owner, ttl)
            pending = list(unread)
            if writes:
                done, changed = await self._put_many(writes, states)
                result.update(dict.fromkeys(done, True))
                for name, seen in changed.items():
                    states[name], fresh[name] = seen, True
                    pending.append(name)
            if not pending:
                return result
        raise BackendUnavailable(
            f"etcd at {self.channel.where}: keys changed {MAX_TRIES} times while "
            "renew_leases decided"
        )

    def _renewals(
        self,
        pending: list[bytes],
        states: dict[bytes, Seen | None],
        fresh: dict[bytes, bool],
        owner: str,
        ttl: int,
    ) -> tuple[list[Write], list[bytes]]:
        """The writes to send for ``pending``, and the names to read first
        (remembered states that show the lease lost)."""
        now = self.now_ms()
        writes: list[Write] = []
        unread: list[bytes] = []
        for name in pending:
            seen = states[name]
            lease = None if seen is None else decode(seen)
            if lease is not None and holds(lease.owner, lease.deadline_ms, owner, now):
                writes.append(Write(name, owner, lease.token, ttl))
            elif not fresh[name]:
                unread.append(name)
            else:
                self.remember(name, None)
        return writes, unread

    async def _get_many(self, names: list[bytes]) -> dict[bytes, Seen | None]:
        found: dict[bytes, Seen | None] = {}
        for at in range(0, len(names), _BATCH):
            chunk = names[at : at + _BATCH]
            ops = [rpc.RequestOp(request_range=rpc.RangeRequest(key=name)) for name in chunk]
            reply = await self.call(
                "renew_leases", self.channel.kv.Txn, rpc.TxnRequest(success=ops)
            )
            for name, response in zip(chunk, reply.responses, strict=True):
                kvs = response.response_range.kvs
                found[name] = seen_of(kvs)
        return found

    async def _put_many(
        self, writes: list[Write], states: dict[bytes, Seen | None]
    ) -> tuple[set[bytes], dict[bytes, Seen | None]]:
        """Each write if its key is unchanged: the keys written, and the others' new states."""
        done: set[bytes] = set()
        outcome: dict[bytes, Seen | None] = {}
        for at in range(0, len(writes), _BATCH):
            chunk = writes[at : at + _BATCH]
            gc = await self.gc_lease(chunk[0].ttl_ms)
            nested = []
            for write in chunk:
                seen = states[write.name]
                assert seen is not None
                compare = rpc.Compare(
                    key=write.name, target=_MOD, result=_EQUAL, mod_revision=seen.mod_revision
                )
                reread = rpc.RequestOp(request_range=rpc.RangeRequest(key=write.name))
                inner = rpc.TxnRequest(
                    compare=[compare], success=[write.op(gc, self.now_ms())], failure=[reread]
                )
                nested.append(rpc.RequestOp(request_txn=inner))
            try:
                reply = await self.call(
                    "renew_leases", self.channel.kv.Txn, rpc.TxnRequest(success=nested)
                )
            except BackendUnavailable as exc:
                if _lease_gone(exc):
                    self._gc.clear()
                    outcome.update({w.name: states[w.name] for w in chunk})
                    continue
                raise
            revision = reply.header.revision
            for write, response in zip(chunk, reply.responses, strict=True):
                inner_reply = response.response_txn
                if inner_reply.succeeded:
                    done.add(write.name)
                    self.remember(write.name, Seen(write.value, revision))
                else:
                    outcome[write.name] = seen_of(inner_reply.responses[0].response_range.kvs)
        return done, outcome


def _compare(name: bytes, seen: Seen | None) -> Any:
    """The compare of a change decided on ``seen``: the key is still in that state."""
    if seen is None:
        return rpc.Compare(key=name, target=_CREATE, result=_EQUAL, create_revision=0)
    return rpc.Compare(key=name, target=_MOD, result=_EQUAL, mod_revision=seen.mod_revision)
