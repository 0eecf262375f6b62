"""``EtcdLeases``: leases on etcd, each change one etcd transaction.

The Python side decides (the rules of ``_core.acquire_step`` and ``holds``)
on a state read in a transaction, and applies the decision with a
transaction that compares the key's ``mod_revision`` with the one it read
(``_keys``): if anything changed in between, nothing is written and the
same transaction returns the new state to decide on again. Release
wake-ups come from one watch (``_watch``).
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

from ..._contract import AcquireResult, LeaseRecord, RefusalReason
from ..._doctor import Finding
from ..._errors import ConfigurationError, InvalidArgument
from ..._validate import MAX_TTL_MS
from .._core import EXTEND, GRANT, LEASE_CAPABILITIES, PAGE, LeaseCore, acquire_step, holds
from .._core import prefix_range as _prefix_range
from ._connection import EtcdChannel, parse_url, rpc
from ._keys import (
    GRANT_TOKEN,
    TRANSFER_TOKEN,
    EtcdKeys,
    Lease,
    Seen,
    Write,
    decode,
    delete,
    ms_of,
    wall_ms,
)
from ._watch import ReleaseWatch

__all__ = ["EtcdLeases"]

_HELD = RefusalReason.HELD


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
    record is only a record, which every reader treats as free. A
    ``get_lease`` that finds such a record deletes it (compared on its
    revision) before it answers "free", so a renew or transfer its holder
    decided before the deadline but that reaches etcd after it fails,
    rather than reviving a lease a reader has already seen end.

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
        # The wall clock of the deadlines, in ms (injectable: a test steps it).
        now_ms = wall_ms if clock is None else ms_of(clock)
        self._keys = EtcdKeys(
            self._ch, timeout=float(timeout), now_ms=now_ms, check_open=self._check_open
        )
        self._release_watch = ReleaseWatch(
            self._ch, self._p, self._waiters, timeout=float(timeout), check_open=self._check_open
        )

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

    # -- the five methods --------------------------------------------------------------

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
        ttl = self._args(key, owner, ttl_ms)
        name = self._name(key)

        def decide(lease: Lease | None, now: int) -> tuple[Write | None, AcquireResult | None]:
            step = (
                GRANT if lease is None else acquire_step(lease.owner, lease.deadline_ms, owner, now)
            )
            if step == GRANT:
                return Write(name, owner, GRANT_TOKEN, ttl), None
            assert lease is not None
            if step == EXTEND:
                return Write(name, owner, lease.token, ttl), None
            return None, AcquireResult(False, lease.owner, None, reason=_HELD)

        # A key this process did not write is most often free: try that first.
        guess = self._keys.remembered(name)
        refused, revision, write = await self._keys.change(
            "acquire", name, decide, guess=guess, guessed=guess is not None
        )
        if refused is not None:
            return refused
        self._keys.remember(name, Seen(write.value, revision))
        return AcquireResult(True, owner, write.kept_token(revision))

    async def _read(self, key: str) -> LeaseRecord | None:
        name = self._name(key)

        def decide(lease: Lease | None, now: int) -> tuple[Any, LeaseRecord | None]:
            if lease is None:
                return None, None
            if lease.deadline_ms > now:
                return None, LeaseRecord(lease.owner, lease.token, lease.deadline_ms - now)
            # A lapsed record is deleted before it is reported free: a renew or
            # transfer decided before the deadline but arriving after it then
            # fails its compare, instead of reviving a lease this read called free.
            return delete(name), None

        seen = await self._keys.get("get_lease", name)
        applied = await self._keys.change("get_lease", name, decide, guess=seen, guessed=False)
        if applied.action is not None:
            self._keys.remember(name, None)
        return applied.result

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        ttl = self._args(key, owner, ttl_ms)
        name = self._name(key)

        def decide(lease: Lease | None, now: int) -> tuple[Write | None, bool]:
            if lease is None or not holds(lease.owner, lease.deadline_ms, owner, now):
                return None, False
            return Write(name, owner, lease.token, ttl), True

        guess, guessed = await self._keys.guess(name)
        renewed, revision, write = await self._keys.change(
            "renew", name, decide, guess=guess, guessed=guessed
        )
        self._keys.remember(name, Seen(write.value, revision) if renewed else None)
        return renewed

    async def release_lease(self, key: str, owner: str) -> None:
        self._args_owner(key, owner)
        name = self._name(key)

        def decide(lease: Lease | None, now: int) -> tuple[Any, bool]:
            if lease is None or not holds(lease.owner, lease.deadline_ms, owner, now):
                return None, False
            return delete(name), True

        guess, guessed = await self._keys.guess(name)
        await self._keys.change("release", name, decide, guess=guess, guessed=guessed)
        self._keys.remember(name, None)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        ttl = self._args_transfer(key, from_owner, to_owner, ttl_ms)
        name = self._name(key)

        def decide(lease: Lease | None, now: int) -> tuple[Write | None, bool]:
            if lease is None or not holds(lease.owner, lease.deadline_ms, from_owner, now):
                return None, False
            return Write(name, to_owner, TRANSFER_TOKEN, ttl), True

        guess, guessed = await self._keys.guess(name)
        moved, revision, write = await self._keys.change(
            "transfer", name, decide, guess=guess, guessed=guessed
        )
        self._keys.remember(name, Seen(write.value, revision) if moved else None)
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
        renewed = await self._keys.renew_many(names, owner, ttl)
        return [renewed[self._name(key)] for key in key_list]

    async def diagnose(self) -> list[Finding]:
        """What ``tenure doctor`` reports about this cluster (:mod:`tenure._doctor`)."""
        from ._doctor import diagnose

        return await diagnose(self._ch, self._keys.call)

    # -- operations ----------------------------------------------------------------------

    async def _scan(self, prefix: str) -> AsyncGenerator[list[tuple[str, LeaseRecord]], None]:
        """Pages of ``PAGE`` keys in key order, each page one range read."""
        low, high = _prefix_range(self._p + prefix.encode("utf-8"))
        if not prefix:
            high = _prefix_range(self._p)[1]
        start = low
        while True:
            reply = await self._keys.call(
                "scan_leases",
                self._ch.kv.Range,
                rpc.RangeRequest(key=start, range_end=high, limit=PAGE),
            )
            now = self._keys.now_ms()
            page = []
            for kv in reply.kvs:
                lease = decode(Seen(kv.value, kv.mod_revision))
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

        def decide(lease: Lease | None, now: int) -> tuple[Any, bool]:
            if lease is None or lease.deadline_ms <= now:
                return None, False
            if token is not None and lease.token != token:
                return None, False
            return delete(name), True

        seen = await self._keys.get("revoke_lease", name)
        revoked, _, _ = await self._keys.change(
            "revoke_lease", name, decide, guess=seen, guessed=False
        )
        self._keys.remember(name, None)
        return revoked

    # -- waiting -----------------------------------------------------------------------

    async def _watch(self, key: str, timeout: float) -> None:
        await self._release_watch.start()

    async def aclose(self) -> None:
        """Stop the watch and close the channel."""
        if self._closed:
            return
        self._closed = True
        await self._release_watch.aclose()
        self._waiters.wake_all()
        await self._ch.aclose()
