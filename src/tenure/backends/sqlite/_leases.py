"""The lease half of the SQLite backend: one ``BEGIN IMMEDIATE`` job per operation.

Acquire and transfer read the lease row and decide in Python with the shared
:func:`~tenure.backends._core.acquire_step` and :func:`~tenure.backends._core.holds`,
inside the transaction that holds the write lock. Renew and release need no
read: their holder check is the ``WHERE`` clause of their one statement.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import AsyncGenerator, Sequence

from ..._contract import AcquireResult, LeaseRecord, RefusalReason
from .._core import EXTEND, GRANT, PAGE, REFUSE, LeaseCore, acquire_step, holds, prefix_range
from ._connection import Connected, execute_chunked, load_sql
from ._wake import FREED, TRANSFERRED

__all__ = ["SqliteLeases"]

_SELECT_LEASE = load_sql("lease_select")
_NEXT_TOKEN = load_sql("lease_next_token")
_INSERT_LEASE = load_sql("lease_insert")
_EXTEND_LEASE = load_sql("lease_extend")
_RENEW_LEASE = load_sql("lease_renew")
_RENEW_MANY = load_sql("lease_renew_many")
_RENEW_OWNED = load_sql("lease_renew_owned")
_RELEASE_LEASE = load_sql("lease_release")
_TRANSFER_LEASE = load_sql("lease_transfer")
_SWEEP_LEASES = load_sql("lease_sweep")
_SCAN_LEASES = load_sql("lease_scan")
_REVOKE_LEASE = load_sql("lease_revoke")

_LEASE_SWEEP_INTERVAL = 60.0


def encode_many(keys: Sequence[str]) -> list[bytes]:
    return [k.encode() for k in keys]


# Keys remembered as held elsewhere (see _acquire_job), at most.
_HELD_KEYS = 10_000


class SqliteLeases(LeaseCore, Connected):
    """Leases in the file, read and written by the worker thread's jobs.

    Keys and owners are stored as the bytes of their ASCII text, deadlines as
    ``clock`` seconds, read inside the transaction after the write lock is
    taken. Tokens come from the counter row in ``tenure_meta``.
    """

    def _init_leases(self) -> None:
        # Last lease token seen for each key with local waiters (None: free);
        # change detection compares against it.
        self._watched: dict[str, int | None] = {}
        # Touched only by jobs, on the worker thread.
        self._next_lease_sweep = -math.inf
        # Keys an acquire here found held by another owner, and that lease's
        # deadline then: until it passes, an acquire of the key reads first.
        self._held_until: dict[bytes, float] = {}

    # -- jobs, on the worker thread ---------------------------------------------------
    # The hot path: BEGIN IMMEDIATE ... COMMIT spelled out; on any error the
    # worker rolls the open transaction back.

    def _acquire_job(
        self, conn: sqlite3.Connection, key: bytes, owner: bytes, ttl_ms: int
    ) -> tuple[bool, bytes, int | None]:
        execute = conn.execute
        held = self._held_until
        if held.get(key, -math.inf) > self._clock():
            # Found held by another owner moments ago, so likely still held (a
            # sender trying a busy thread's lease, a waiter looking again): a
            # look first, outside any transaction, refuses it without taking
            # the file's write lock, which every writer of the file shares. A
            # refusal changes nothing, and the row was live when read (its
            # deadline is past the clock read after it). Other keys go straight
            # to the write: a grant would pay for the look.
            rows = execute(_SELECT_LEASE, (key,)).fetchall()
            if rows and acquire_step(rows[0][0], rows[0][2], owner, self._clock()) == REFUSE:
                held[key] = rows[0][2]
                return False, rows[0][0], None
        execute("BEGIN IMMEDIATE")
        now = self._clock()
        row = execute(_SELECT_LEASE, (key,)).fetchone()
        step = GRANT if row is None else acquire_step(row[0], row[2], owner, now)
        if step == REFUSE:
            execute("COMMIT")
            if len(held) >= _HELD_KEYS:
                held.clear()
            held[key] = row[2]
            return False, row[0], None
        held.pop(key, None)
        deadline = now + ttl_ms / 1000
        if step == EXTEND:
            execute(_EXTEND_LEASE, (deadline, key))
            token: int = row[1]
        else:
            token = execute(_NEXT_TOKEN).fetchone()[0]
            execute(_INSERT_LEASE, (key, owner, token, deadline))
        if now >= self._next_lease_sweep:
            self._next_lease_sweep = now + _LEASE_SWEEP_INTERVAL
            execute(_SWEEP_LEASES, (now,))
        execute("COMMIT")
        return True, owner, token

    def _read_lease_job(
        self, conn: sqlite3.Connection, key: bytes
    ) -> tuple[bytes, int, float] | None:
        row = conn.execute(_SELECT_LEASE, (key,)).fetchone()
        now = self._clock()
        if row is None or row[2] <= now:
            return None
        return row[0], row[1], row[2] - now

    def _release_job(self, conn: sqlite3.Connection, key: bytes, owner: bytes) -> bool:
        conn.execute("BEGIN IMMEDIATE")
        released = conn.execute(_RELEASE_LEASE, (key, owner, self._clock())).rowcount
        conn.execute("COMMIT")
        if released:
            self._worker.wake.ring(FREED, key)
        return released == 1

    def _renew_job(self, conn: sqlite3.Connection, key: bytes, owner: bytes, ttl_ms: int) -> bool:
        conn.execute("BEGIN IMMEDIATE")
        now = self._clock()
        renewed = conn.execute(_RENEW_LEASE, (now + ttl_ms / 1000, key, owner, now)).rowcount
        conn.execute("COMMIT")
        return renewed == 1

    def _renew_many_job(
        self, conn: sqlite3.Connection, keys: list[bytes], owner: bytes, ttl_ms: int
    ) -> set[bytes]:
        with self._write(conn):
            now = self._clock()
            rows = execute_chunked(conn, _RENEW_MANY, keys, now + ttl_ms / 1000, owner, now)
        return {r[0] for r in rows}

    def _renew_owned_job(
        self, conn: sqlite3.Connection, pairs: list[tuple[bytes, bytes]], ttl_ms: int
    ) -> list[bool]:
        with self._write(conn):
            now = self._clock()
            rows = execute_chunked(conn, _RENEW_OWNED, pairs, now + ttl_ms / 1000, now, width=2)
        renewed = {(bytes(key), bytes(owner)) for key, owner in rows}
        return [pair in renewed for pair in pairs]

    def _scan_job(
        self, conn: sqlite3.Connection, low: bytes, high: bytes
    ) -> list[tuple[bytes, bytes, int, float]]:
        now = self._clock()
        rows = conn.execute(_SCAN_LEASES, (low, high, now, PAGE)).fetchall()
        return [(key, owner, token, deadline - now) for key, owner, token, deadline in rows]

    def _revoke_job(self, conn: sqlite3.Connection, key: bytes, token: int | None) -> bool:
        conn.execute("BEGIN IMMEDIATE")
        revoked = conn.execute(_REVOKE_LEASE, (key, self._clock(), token, token)).rowcount
        conn.execute("COMMIT")
        if revoked:
            self._worker.wake.ring(FREED, key)
        return revoked == 1

    def _transfer_job(
        self, conn: sqlite3.Connection, key: bytes, from_owner: bytes, to_owner: bytes, ttl_ms: int
    ) -> int | None:
        conn.execute("BEGIN IMMEDIATE")
        now = self._clock()
        row = conn.execute(_SELECT_LEASE, (key,)).fetchone()
        if row is None or not holds(row[0], row[2], from_owner, now):
            conn.execute("COMMIT")
            return None
        token: int = conn.execute(_NEXT_TOKEN).fetchone()[0]
        conn.execute(_TRANSFER_LEASE, (to_owner, token, now + ttl_ms / 1000, key))
        conn.execute("COMMIT")
        self._worker.wake.ring(TRANSFERRED, key)
        return token

    # -- the contract ---------------------------------------------------------------

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
        ttl = self._args(key, owner, ttl_ms)
        acquired, holder, token = await self._run(
            self._acquire_job, key.encode(), owner.encode(), ttl
        )
        if not acquired:
            return AcquireResult(False, holder.decode(), None, reason=RefusalReason.HELD)
        if key in self._watched:
            self._watched[key] = token
        return AcquireResult(True, owner, token)

    async def _read(self, key: str) -> LeaseRecord | None:
        row = await self._run(self._read_lease_job, key.encode())
        if row is None:
            return None
        owner, token, remaining = row
        return LeaseRecord(owner.decode(), token, max(1, math.ceil(remaining * 1000)))

    async def release_lease(self, key: str, owner: str) -> None:
        self._args_owner(key, owner)
        if await self._run(self._release_job, key.encode(), owner.encode()):
            if key in self._watched:
                self._watched[key] = None
            self._freed(key)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        ttl = self._args(key, owner, ttl_ms)
        return await self._run(self._renew_job, key.encode(), owner.encode(), ttl)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        ttl = self._args_transfer(key, from_owner, to_owner, ttl_ms)
        token = await self._run(
            self._transfer_job, key.encode(), from_owner.encode(), to_owner.encode(), ttl
        )
        if token is None:
            return False
        if key in self._watched:
            self._watched[key] = token
        self._freed(key)
        return True

    async def renew_leases(self, keys: Sequence[str], owner: str, ttl_ms: int) -> list[bool]:
        """Renew many of ``owner``'s leases in one transaction; one ``bool`` per key, in order."""
        key_list, ttl = self._args_batch(keys, owner, ttl_ms)
        encoded = encode_many(key_list)
        if not encoded:
            return []
        renewed = await self._run(self._renew_many_job, encoded, owner.encode(), ttl)
        return [k in renewed for k in encoded]

    async def _renew_owned(self, pairs: list[tuple[str, str]], ttl_ms: int) -> list[bool]:
        """Every pair's renewal in one write transaction (``lease_renew_owned.sql``)."""
        encoded = [(key.encode(), owner.encode()) for key, owner in pairs]
        return await self._run(self._renew_owned_job, encoded, ttl_ms)

    async def _scan(self, prefix: str) -> AsyncGenerator[list[tuple[str, LeaseRecord]], None]:
        low, high = prefix_range(prefix.encode())
        while True:
            rows = await self._run(self._scan_job, low, high)
            yield [
                (key.decode(), LeaseRecord(owner.decode(), token, max(1, math.ceil(left * 1000))))
                for key, owner, token, left in rows
            ]
            if len(rows) < PAGE:
                return
            low = rows[-1][0] + b"\0"  # the first key after the page's last

    async def _revoke(self, key: str, token: int | None) -> bool:
        if not await self._run(self._revoke_job, key.encode(), token):
            return False
        if key in self._watched:
            self._watched[key] = None
        return True

    # -- waiting: releases made by other processes ring the wake channel -------------

    async def _watch(self, key: str, timeout: float) -> None:
        self._worker.set_polling(True)

    def _watching(self, key: str, record: LeaseRecord) -> None:
        self._watched[key] = record.token

    def _unwatch(self) -> None:
        self._update_polling()
