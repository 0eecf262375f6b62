"""``EtcdLeases``: leases on etcd, each change one etcd transaction.

The Python side decides (the rules of ``_core.acquire_step`` and ``holds``)
on a state read in a transaction, and applies the decision with a
transaction that compares the key's ``mod_revision`` with the one it read:
if anything changed in between, nothing is written and the same transaction
returns the new state to decide on again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any, NamedTuple, TypeVar

from ..._contract import AcquireResult, LeaseRecord, RefusalReason
from ..._doctor import Finding
from ..._errors import BackendUnavailable, ConfigurationError, InvalidArgument
from ..._validate import MAX_TTL_MS
from .._core import EXTEND, GRANT, LEASE_CAPABILITIES, PAGE, LeaseCore, acquire_step, holds
from .._core import prefix_range as _prefix_range
from ._connection import EtcdChannel, parse_url, rpc

__all__ = ["EtcdLeases"]

logger = logging.getLogger("tenure.etcd")

R = TypeVar("R")

# A decision that found the key changed under it is taken again on the new
# state; this many changes in a row mean a storm of writers on one key.
_MAX_TRIES = 64
# How many keys' last written state a backend remembers (to skip a read).
_REMEMBERED = 65536
# Operations per etcd transaction (etcd's --max-txn-ops is 128 by default).
_BATCH = 100
# An etcd lease (the clean-up of forgotten keys) must outlive every deadline
# attached to it by this much (a margin for the server's clock rate).
_GC_MARGIN_S = 0.5
_CREATE, _MOD = rpc.Compare.CompareTarget.CREATE, rpc.Compare.CompareTarget.MOD
_EQUAL = rpc.Compare.CompareResult.EQUAL
_DELETE = rpc.Event.EventType.DELETE
_LEADER_ONLY = (("hasleader", "true"),)


class _Seen(NamedTuple):
    """A key's value and ``mod_revision`` as read (or written) in one step."""

    value: bytes
    mod_revision: int


class _Lease(NamedTuple):
    owner: str
    token: int
    deadline_ms: int


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _ms_of(clock: Callable[[], float]) -> Callable[[], int]:
    return lambda: int(clock() * 1000)


# The token field of a new owner's write: its token is the mod_revision of that
# very write. "00" marks a transfer, which wakes a waiter (a grant does not).
_GRANT, _TRANSFER = b"0", b"00"


def _encode(token: int | bytes, deadline_ms: int, owner: str) -> bytes:
    head = token if isinstance(token, bytes) else b"%d" % token
    return head + b":%d:" % deadline_ms + owner.encode("utf-8")


def _decode(seen: _Seen) -> _Lease | None:
    token, _, rest = seen.value.partition(b":")
    deadline, _, owner = rest.partition(b":")
    try:
        number = int(token)
        return _Lease(owner.decode("utf-8"), number or seen.mod_revision, int(deadline))
    except ValueError:
        return None  # not written by tenure


def _delete(name: bytes) -> Any:
    return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=name))


def _lease_gone(exc: BackendUnavailable) -> bool:
    """Whether a put failed because its clean-up lease had ended (nothing was written)."""
    return "requested lease not found" in str(exc)


class _Write:
    """A put of a lease, built just before it is sent (its deadline counts from then)."""

    __slots__ = ("name", "owner", "token", "ttl_ms", "value")

    def __init__(self, name: bytes, owner: str, token: int | bytes, ttl_ms: int) -> None:
        self.name, self.owner, self.token, self.ttl_ms = name, owner, token, ttl_ms
        self.value = b""

    def op(self, gc_lease: int, now_ms: int) -> Any:
        self.value = _encode(self.token, now_ms + self.ttl_ms, self.owner)
        return rpc.RequestOp(
            request_put=rpc.PutRequest(key=self.name, value=self.value, lease=gc_lease)
        )


class EtcdLeases(LeaseCore):
    """Leases on an etcd v3 cluster, for safety through a failover.

    **Atomic steps.** Every change is one etcd transaction (``Txn``) that
    compares the key's ``mod_revision`` (or, for a free key, its
    ``create_revision`` with 0) with the state the decision was made on, so
    two clients never both act on one state; a transaction whose compare
    fails writes nothing and returns the new state in the same step, and the
    decision is taken again. A refused acquire names the holder it found in
    that atomic read. etcd commits a transaction through Raft on a majority
    of the members before it answers, so a grant survives the loss of the
    leader or of any minority of members: after a failover no second owner
    can be granted on a state that forgot the first.

    **Fencing tokens** are etcd revisions: a grant or transfer's token is
    the ``mod_revision`` of its write, which is cluster-wide and strictly
    increasing (kept through leader changes and restarts), so tokens of a
    key strictly increase across release, expiry, revocation and transfer.
    A renew or same-owner re-acquire writes the token it keeps into the
    value.

    **Expiry and its clock.** etcd's own leases count whole seconds, with a
    server minimum of 1.5 election timeouts rounded up to a second (2 s with
    etcd's defaults), and etcd offers no millisecond clock. So expiry is the
    deadline (``now + ttl_ms``) that each write stores in the value, on the
    writing client's wall clock (``time.time()``, or ``clock``), compared
    with the reading client's. There is no TTL floor: ``ttl_ms`` is honoured
    to the millisecond, from 1 ms, as on every backend. A lease never lives
    shorter than ``ttl_ms`` *provided the clients' clocks agree* (NTP): a
    client whose clock runs ``δ`` ahead of the holder's sees the lease end
    ``δ`` early and may be granted it then (with a higher token, so fencing
    still rejects the old holder's writes), and a clock stepped forward does
    the same for that client; the leases it writes then last ``δ`` longer
    for the others. This is the one place where this backend
    trusts clocks of clients rather than a server. The key itself is
    attached to an etcd lease of ``2·⌈ttl_ms/1000⌉ + 1`` seconds (shared by
    this process's writes of the same length, and never one that could end
    before the deadline), so etcd deletes a lease its owner forgot at most
    that long after its deadline, plus up to one election timeout per leader
    change (a new leader restarts the countdown); until then the stored
    record is only a record, which every reader treats as free.

    **Compaction.** Every renewal is a write, and etcd keeps old revisions
    until they are compacted: run etcd with ``--auto-compaction-retention``
    (as Kubernetes does), or its database grows without bound.

    **Failures.** Calls that fail or take longer than ``timeout`` (default
    5 s) raise :class:`BackendUnavailable`; the outcome is then unknown
    (every operation is safe to retry; a retried transfer that had succeeded
    reports ``False``). The channel knows every member given in the URL
    (round robin), so a dead or paused member fails one call, and keep-alive
    pings drop its connection; a member cut off from the majority cannot
    answer (etcd refuses rather than serve a stale state).

    **Waiting.** One etcd ``watch`` on the key prefix per backend (created
    with ``require leader``, so a member cut off from the leader ends it): a
    deletion (release, revocation, clean-up of a forgotten lease) or a
    transfer of a key wakes one local waiter (a grant or renewal wakes
    nobody); a broken watch wakes every waiter.

    **fork().** gRPC's core does not survive ``fork()``: in a child of a
    process that had used etcd, every etcd backend (inherited, rebuilt by
    ``tenure.sync``, or new) raises :class:`ConfigurationError` naming the
    fix (start workers with ``spawn`` or ``forkserver``, or fork before the
    first etcd call) instead of crashing.

    **Events.** etcd is not a queue: this backend carries leases only (no
    ``Capability.EVENTS``), and :class:`~tenure.runtime.ThreadRuntime` and
    ``tenure demo`` refuse it with :class:`ConfigurationError`.
    """

    capabilities = LEASE_CAPABILITIES

    def __init__(
        self,
        endpoints: Sequence[tuple[str, int]],
        *,
        prefix: str = "tenure/",
        max_ttl_ms: int = MAX_TTL_MS,
        timeout: float = 5.0,
        tls: bool = False,
        ca: str | None = None,
        cert: str | None = None,
        key: str | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if not isinstance(prefix, str) or not prefix:
            raise ConfigurationError(f"prefix must be a non-empty str, got {prefix!r}")
        if type(max_ttl_ms) is not int or not 1 <= max_ttl_ms <= MAX_TTL_MS:
            raise InvalidArgument(
                f"max_ttl_ms must be an int in 1..{MAX_TTL_MS}, got {max_ttl_ms!r}"
            )
        if not isinstance(timeout, int | float) or not 0 < timeout < math.inf:
            raise ConfigurationError(f"timeout must be a number of seconds > 0, got {timeout!r}")
        super().__init__(max_ttl_ms=max_ttl_ms)
        self._p = prefix.encode("utf-8")
        self._prefix = prefix
        self._ch = EtcdChannel(
            list(endpoints), timeout=float(timeout), tls=tls, ca=ca, cert=cert, key=key
        )
        self._timeout = float(timeout)
        # The wall clock of the deadlines, in ms (injectable: a test steps it).
        self._now_ms = _wall_ms if clock is None else _ms_of(clock)
        # What this backend last wrote per key: a renew or release of it needs no read first.
        self._seen: OrderedDict[bytes, _Seen] = OrderedDict()
        # etcd leases for clean-up, by length in seconds: (id, local time it may end).
        self._gc: dict[int, tuple[int, float]] = {}
        self._gc_granting: dict[int, asyncio.Future[None]] = {}
        self._watcher: asyncio.Task[None] | None = None
        self._watch_lock: asyncio.Lock | None = None

    @classmethod
    def from_url(cls, url: str, **options: Any) -> EtcdLeases:
        """``etcd://host:port[,host:port…][?…]`` or ``etcds://…`` (TLS).

        List every member (or several): calls go round robin to those that
        answer. Options: ``prefix`` (of every key, default ``tenure/``),
        ``max_ttl_ms``, ``timeout`` (seconds per call, default 5), and for
        ``etcds://`` the files ``ca`` (the CA to trust; the system's by
        default), ``cert`` and ``key`` (a client certificate). Keyword
        ``options`` override the query, and add ``clock`` (a function
        returning the wall-clock time in seconds, ``time.time`` by default).
        Nothing is connected until first use.
        """
        endpoints, ours = parse_url(url, options)
        return cls(endpoints, **ours)

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"EtcdLeases({self._ch.where}, prefix={self._prefix!r}{state})"

    def _name(self, key: str) -> bytes:
        return self._p + key.encode("utf-8")

    # -- one step on the server ------------------------------------------------------

    async def _call(self, op: str, method: Any, request: Any, **kwargs: Any) -> Any:
        self._check_open()
        with self._ch.errors(op):
            # A member that knows no leader answers at once instead of at the time-out.
            return await method(request, timeout=self._timeout, metadata=_LEADER_ONLY, **kwargs)

    async def _get(self, op: str, name: bytes) -> _Seen | None:
        reply = await self._call(op, self._ch.kv.Range, rpc.RangeRequest(key=name))
        return _Seen(reply.kvs[0].value, reply.kvs[0].mod_revision) if reply.kvs else None

    def _remember(self, name: bytes, seen: _Seen | None) -> None:
        if seen is None:
            self._seen.pop(name, None)
            return
        self._seen[name] = seen
        self._seen.move_to_end(name)
        if len(self._seen) > _REMEMBERED:
            self._seen.popitem(last=False)

    async def _change(
        self,
        op: str,
        name: bytes,
        decide: Callable[[_Lease | None, int], tuple[Any, R]],
        *,
        guess: _Seen | None,
        guessed: bool,
    ) -> tuple[R, int]:
        """Decide on the key's state and apply the decision in one transaction.

        ``decide(lease, now_ms)`` returns ``(operation or None, result)``;
        the operation is a :class:`_Write` or a delete.
        ``guess`` is the state to try first; when ``guessed`` it was not read
        from the server, so a decision to write nothing is checked by a read.
        Returns the result and the revision of the write (0 if none).
        """
        seen = guess
        for _ in range(_MAX_TRIES):
            lease = None if seen is None else _decode(seen)
            action, result = decide(lease, self._now_ms())
            if action is None:
                if guessed:
                    seen, guessed = await self._get(op, name), False
                    continue
                return result, 0
            if seen is None:
                compare = rpc.Compare(key=name, target=_CREATE, result=_EQUAL, create_revision=0)
            else:
                compare = rpc.Compare(
                    key=name, target=_MOD, result=_EQUAL, mod_revision=seen.mod_revision
                )
            reply = await self._txn(op, compare, action, name)
            if reply is None:  # the clean-up lease ended before the write arrived
                continue
            if reply.succeeded:
                return result, reply.header.revision
            kvs = reply.responses[0].response_range.kvs
            seen = _Seen(kvs[0].value, kvs[0].mod_revision) if kvs else None
            guessed = False
        raise BackendUnavailable(
            f"etcd at {self._ch.where}: the key changed {_MAX_TRIES} times while {op} decided"
        )

    async def _txn(self, op: str, compare: Any, action: Any, name: bytes) -> Any:
        write = isinstance(action, _Write)
        if isinstance(action, _Write):
            action = action.op(await self._gc_lease(action.ttl_ms), self._now_ms())
        request = rpc.TxnRequest(
            compare=[compare],
            success=[action],
            failure=[rpc.RequestOp(request_range=rpc.RangeRequest(key=name))],
        )
        try:
            return await self._call(op, self._ch.kv.Txn, request)
        except BackendUnavailable as exc:
            if write and _lease_gone(exc):
                self._gc.clear()
                return None
            raise

    async def _gc_lease(self, ttl_ms: int) -> int:
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
                reply = await self._call("LeaseGrant", self._ch.lease.LeaseGrant, request)
                # The server may raise a short TTL to its minimum, never lower it.
                self._gc[seconds] = (int(reply.ID), sent + reply.TTL)
            finally:
                del self._gc_granting[seconds]
                granting.set_result(None)

    # -- the five methods --------------------------------------------------------------

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
        ttl = self._args(key, owner, ttl_ms)
        name = self._name(key)
        put: list[Any] = []

        def decide(lease: _Lease | None, now: int) -> tuple[Any, AcquireResult]:
            if lease is None:
                step = GRANT
            else:
                step = acquire_step(lease.owner, lease.deadline_ms, owner, now)
            if step == GRANT:
                put[:] = [_Write(name, owner, _GRANT, ttl), 0]
                return put[0], AcquireResult(True, owner, None)
            if step == EXTEND:
                assert lease is not None
                put[:] = [_Write(name, owner, lease.token, ttl), lease.token]
                return put[0], AcquireResult(True, owner, lease.token)
            assert lease is not None
            return None, AcquireResult(False, lease.owner, None, reason=RefusalReason.HELD)

        # A key this process did not write is most often free: try that first.
        guess = self._seen.get(name)
        result, revision = await self._change(
            "acquire", name, decide, guess=guess, guessed=guess is not None
        )
        if not result.acquired:
            return result
        token = put[1] or revision
        self._remember(name, _Seen(put[0].value, revision))
        return AcquireResult(True, owner, token)

    async def _read(self, key: str) -> LeaseRecord | None:
        seen = await self._get("get_lease", self._name(key))
        lease = None if seen is None else _decode(seen)
        if lease is None:
            return None
        left = lease.deadline_ms - self._now_ms()
        if left <= 0:
            return None
        return LeaseRecord(lease.owner, lease.token, left)

    async def _guess(self, name: bytes) -> tuple[_Seen | None, bool]:
        seen = self._seen.get(name)
        if seen is not None:
            return seen, True
        return await self._get("read", name), False

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        ttl = self._args(key, owner, ttl_ms)
        return await self._renew(self._name(key), owner, ttl)

    async def _renew(self, name: bytes, owner: str, ttl: int) -> bool:
        put: list[Any] = []

        def decide(lease: _Lease | None, now: int) -> tuple[Any, bool]:
            if lease is None or not holds(lease.owner, lease.deadline_ms, owner, now):
                return None, False
            put[:] = [_Write(name, owner, lease.token, ttl)]
            return put[0], True

        guess, guessed = await self._guess(name)
        renewed, revision = await self._change("renew", name, decide, guess=guess, guessed=guessed)
        if renewed:
            self._remember(name, _Seen(put[0].value, revision))
        else:
            self._remember(name, None)
        return renewed

    async def release_lease(self, key: str, owner: str) -> None:
        self._args_owner(key, owner)
        name = self._name(key)

        def decide(lease: _Lease | None, now: int) -> tuple[Any, bool]:
            if lease is None or not holds(lease.owner, lease.deadline_ms, owner, now):
                return None, False
            return _delete(name), True

        guess, guessed = await self._guess(name)
        await self._change("release", name, decide, guess=guess, guessed=guessed)
        self._remember(name, None)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        ttl = self._args_transfer(key, from_owner, to_owner, ttl_ms)
        name = self._name(key)
        put: list[Any] = []

        def decide(lease: _Lease | None, now: int) -> tuple[Any, bool]:
            if lease is None or not holds(lease.owner, lease.deadline_ms, from_owner, now):
                return None, False
            put[:] = [_Write(name, to_owner, _TRANSFER, ttl)]
            return put[0], True

        guess, guessed = await self._guess(name)
        moved, revision = await self._change("transfer", name, decide, guess=guess, guessed=guessed)
        self._remember(name, _Seen(put[0].value, revision) if moved else None)
        return moved

    async def renew_leases(self, keys: Sequence[str], owner: str, ttl_ms: int) -> list[bool]:
        """Renew many of ``owner``'s leases at once; one ``bool`` per key, in order.

        Up to 100 renewals go in one etcd transaction, each a transaction of
        its own nested in it (its own compare on the key's ``mod_revision``),
        so each renewal is atomic and independent, and a batch costs one Raft
        entry per 100 keys. Keys this backend did not write last are read
        first (100 per read); a renewal that found its key changed is decided
        again on the state its nested transaction returned.
        """
        key_list, ttl = self._args_batch(keys, owner, ttl_ms)
        names = list(dict.fromkeys(self._name(key) for key in key_list))
        renewed = await self._renew_names(names, owner, ttl)
        return [renewed[self._name(key)] for key in key_list]

    async def _renew_names(self, names: list[bytes], owner: str, ttl: int) -> dict[bytes, bool]:
        result = dict.fromkeys(names, False)
        states: dict[bytes, _Seen | None] = {name: self._seen.get(name) for name in names}
        fresh = {name: name not in self._seen for name in names}
        unread = [name for name in names if fresh[name]]
        pending = names
        for _ in range(_MAX_TRIES):
            if unread:
                states.update(await self._get_many(unread))
                fresh.update(dict.fromkeys(unread, True))
            now = self._now_ms()
            writes: list[_Write] = []
            unread = []
            for name in pending:
                seen = states[name]
                lease = None if seen is None else _decode(seen)
                if lease is not None and holds(lease.owner, lease.deadline_ms, owner, now):
                    writes.append(_Write(name, owner, lease.token, ttl))
                elif not fresh[name]:
                    unread.append(name)
                else:
                    self._remember(name, None)
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
            f"etcd at {self._ch.where}: keys changed {_MAX_TRIES} times while renew_leases decided"
        )

    async def _get_many(self, names: list[bytes]) -> dict[bytes, _Seen | None]:
        found: dict[bytes, _Seen | None] = {}
        for at in range(0, len(names), _BATCH):
            chunk = names[at : at + _BATCH]
            ops = [rpc.RequestOp(request_range=rpc.RangeRequest(key=name)) for name in chunk]
            reply = await self._call("renew_leases", self._ch.kv.Txn, rpc.TxnRequest(success=ops))
            for name, response in zip(chunk, reply.responses, strict=True):
                kvs = response.response_range.kvs
                found[name] = _Seen(kvs[0].value, kvs[0].mod_revision) if kvs else None
        return found

    async def _put_many(
        self, writes: list[_Write], states: dict[bytes, _Seen | None]
    ) -> tuple[set[bytes], dict[bytes, _Seen | None]]:
        """Each write if its key is unchanged: the keys written, and the others' new states."""
        done: set[bytes] = set()
        outcome: dict[bytes, _Seen | None] = {}
        for at in range(0, len(writes), _BATCH):
            chunk = writes[at : at + _BATCH]
            gc = await self._gc_lease(chunk[0].ttl_ms)
            nested = []
            for write in chunk:
                seen = states[write.name]
                assert seen is not None
                compare = rpc.Compare(
                    key=write.name, target=_MOD, result=_EQUAL, mod_revision=seen.mod_revision
                )
                reread = rpc.RequestOp(request_range=rpc.RangeRequest(key=write.name))
                inner = rpc.TxnRequest(
                    compare=[compare], success=[write.op(gc, self._now_ms())], failure=[reread]
                )
                nested.append(rpc.RequestOp(request_txn=inner))
            try:
                reply = await self._call(
                    "renew_leases", self._ch.kv.Txn, rpc.TxnRequest(success=nested)
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
                    self._remember(write.name, _Seen(write.value, revision))
                else:
                    kvs = inner_reply.responses[0].response_range.kvs
                    outcome[write.name] = _Seen(kvs[0].value, kvs[0].mod_revision) if kvs else None
        return done, outcome

    async def diagnose(self) -> list[Finding]:
        """What ``tenure doctor`` reports about this cluster (:mod:`tenure._doctor`)."""
        from ._doctor import diagnose

        return await diagnose(self)

    # -- operations ----------------------------------------------------------------------

    async def _scan(self, prefix: str) -> AsyncGenerator[list[tuple[str, LeaseRecord]], None]:
        """Pages of ``PAGE`` keys in key order, each page one range read."""
        low, high = _prefix_range(self._p + prefix.encode("utf-8"))
        if not prefix:
            high = _prefix_range(self._p)[1]
        start = low
        while True:
            reply = await self._call(
                "scan_leases",
                self._ch.kv.Range,
                rpc.RangeRequest(key=start, range_end=high, limit=PAGE),
            )
            now = self._now_ms()
            page = []
            for kv in reply.kvs:
                lease = _decode(_Seen(kv.value, kv.mod_revision))
                if lease is not None and lease.deadline_ms > now:
                    key = bytes(kv.key[len(self._p) :]).decode("utf-8")
                    page.append(
                        (key, LeaseRecord(lease.owner, lease.token, lease.deadline_ms - now))
                    )
            if page:
                yield page
            if not reply.more or not reply.kvs:
                return
            start = bytes(reply.kvs[-1].key) + b"\0"

    async def _revoke(self, key: str, token: int | None) -> bool:
        name = self._name(key)

        def decide(lease: _Lease | None, now: int) -> tuple[Any, bool]:
            if lease is None or lease.deadline_ms <= now:
                return None, False
            if token is not None and lease.token != token:
                return None, False
            return _delete(name), True

        revoked, _ = await self._change(
            "revoke_lease", name, decide, guess=await self._get("revoke_lease", name), guessed=False
        )
        self._remember(name, None)
        return revoked

    # -- waiting -----------------------------------------------------------------------

    async def _watch(self, key: str, timeout: float) -> None:
        if self._watcher is not None and not self._watcher.done():
            return
        if self._watch_lock is None:
            self._watch_lock = asyncio.Lock()
        async with self._watch_lock:
            if self._watcher is not None and not self._watcher.done():
                return
            self._check_open()
            low, high = _prefix_range(self._p)
            call = self._ch.watch.Watch(metadata=_LEADER_ONLY)
            try:
                with self._ch.errors("watch"):
                    create = rpc.WatchCreateRequest(key=low, range_end=high)
                    await asyncio.wait_for(
                        call.write(rpc.WatchRequest(create_request=create)), self._timeout
                    )
                    # Wait for the confirmation: a release before it would be missed.
                    reply = await asyncio.wait_for(call.read(), self._timeout)
                    if reply is None or not getattr(reply, "created", False):
                        raise BackendUnavailable(
                            f"etcd at {self._ch.where} did not create the watch"
                        )
            except BaseException:
                call.cancel()
                raise
            self._watcher = asyncio.get_running_loop().create_task(
                self._listen(call), name="tenure-etcd-watch"
            )

    async def _listen(self, call: Any) -> None:
        skip = len(self._p)
        try:
            while True:
                reply = await call.read()
                if not isinstance(reply, rpc.WatchResponse) or reply.canceled:
                    break
                for event in reply.events:
                    if event.type == _DELETE or event.kv.value.startswith(_TRANSFER + b":"):
                        self._waiters.wake_one(
                            bytes(event.kv.key[skip:]).decode("utf-8", "replace")
                        )
            logger.warning("the etcd watch at %s ended; waking every waiter", self._ch.where)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning(
                "the etcd watch at %s failed (%s); waking every waiter",
                self._ch.where,
                type(exc).__name__,
            )
        finally:
            self._waiters.wake_all()
            call.cancel()

    async def aclose(self) -> None:
        """Stop the watch and close the channel."""
        if self._closed:
            return
        self._closed = True
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        self._waiters.wake_all()
        await self._ch.aclose()
