"""Negative controls: backends broken the way real bugs break them.

Each mutant is a subclass of a shipped backend that overrides one lease step.
They live here, outside the library, and are reachable only through
:func:`open_backend` with an explicit mutant name (the runner's ``--mutant``
switch): nothing in ``tenure`` can construct one.

A mutant whose bug is a race (read-then-write, a token issued outside the grant)
yields to the event loop for a few milliseconds inside the race window. Real
code has such a window too (a network round trip, a GC pause); widening it lets a
one-minute run hit it instead of a day-long one; and 5% of the time the gap is a
stall of 1-2 TTLs (the GC pause or slow round trip that makes such bugs bite).

``no-fencing`` is not a backend mutant: the runner turns off the fenced store's
token check (P4 must then fail under client pauses).
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import tenure
from tenure import AcquireResult
from tenure._validate import check_name, check_ttl
from tenure.backends.memory import _DEADLINE, _OWNER, _TOKEN, MemoryPubSub, _granted

__all__ = ["BACKEND_MUTANTS", "MUTANTS", "mutants_for", "open_backend"]

RACE_S = 0.004
STALL_P = 0.05
_rnd = random.Random()


async def _race_window(ttl_ms: int) -> None:
    """The gap inside the buggy step: usually a few ms, now and then a stall of 1-2 TTLs."""
    if _rnd.random() < STALL_P:
        await asyncio.sleep(_rnd.uniform(1.0, 2.0) * ttl_ms / 1000)
    else:
        await asyncio.sleep(RACE_S)


MUTANTS = (
    "release-plain-delete",
    "renew-no-owner-check",
    "acquire-read-then-write",
    "token-outside-atomic",
    "no-fencing",
)
BACKEND_MUTANTS = MUTANTS[:4]


def mutants_for(kind: str) -> tuple[str, ...]:
    """The controls that apply to backend ``kind`` (all of them, for now, everywhere)."""
    del kind
    return MUTANTS


# -- memory -----------------------------------------------------------------------


class _MemoryMutant(MemoryPubSub):
    mutant = ""

    def _store(self, key: str, owner: str, token: int, deadline: float) -> AcquireResult:
        grant = _granted(owner, token)
        self._leases[key] = [deadline, owner, token, grant]
        return grant

    async def release_lease(self, key: str, owner: str) -> None:
        if self.mutant != "release-plain-delete":
            return await super().release_lease(key, owner)
        self._check_open()
        self._leases.pop(key, None)  # BUG: no ownership check

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        if self.mutant != "renew-no-owner-check":
            return await super().renew_lease(key, owner, ttl_ms)
        now = self._clock()
        lease = self._live(key, now)
        if lease is None:
            return False
        lease[_DEADLINE] = now + ttl_ms / 1000  # BUG: extends whoever holds it
        return True

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
        if self.mutant == "acquire-read-then-write":
            lease = self._live(key, self._clock())
            if lease is not None and lease[_OWNER] != owner:
                return AcquireResult(False, lease[_OWNER], None)
            await _race_window(ttl_ms)  # BUG: the write does not re-check the read
            self._last_token += 1
            now = self._clock()
            return self._store(key, owner, self._last_token, now + ttl_ms / 1000)
        if self.mutant == "token-outside-atomic":
            token = self._last_token + 1  # BUG: token taken before, apart from the grant
            await _race_window(ttl_ms)
            now = self._clock()
            lease = self._live(key, now)
            if lease is not None and lease[_OWNER] != owner:
                return AcquireResult(False, lease[_OWNER], None)
            if lease is not None:
                lease[_DEADLINE] = now + ttl_ms / 1000
                return AcquireResult(True, owner, lease[_TOKEN])
            self._last_token = max(self._last_token, token)
            return self._store(key, owner, token, now + ttl_ms / 1000)
        return await super().acquire_lease(key, owner, ttl_ms)


# -- SQLite -----------------------------------------------------------------------


def _sqlite_mutant(name: str, url: str) -> Any:
    from tenure.backends.sqlite import SqlitePubSub

    class SqliteMutant(SqlitePubSub):
        def _release_job(self, conn: Any, key: bytes, owner: bytes) -> bool:
            if name != "release-plain-delete":
                return super()._release_job(conn, key, owner)
            with self._write(conn):
                # BUG: no ownership check
                return bool(
                    conn.execute("DELETE FROM tenure_leases WHERE key = ?", (key,)).rowcount
                )

        def _renew_job(self, conn: Any, key: bytes, owner: bytes, ttl_ms: int) -> bool:
            if name != "renew-no-owner-check":
                return super()._renew_job(conn, key, owner, ttl_ms)
            with self._write(conn):
                now = self._clock()
                return bool(
                    conn.execute(
                        # BUG: no owner in the WHERE clause
                        "UPDATE tenure_leases SET deadline = ? WHERE key = ? AND deadline > ?",
                        (now + ttl_ms / 1000, key, now),
                    ).rowcount
                    == 1
                )

        def _read_job(self, conn: Any, key: bytes) -> Any:
            return conn.execute(
                "SELECT owner, token, deadline FROM tenure_leases WHERE key = ?", (key,)
            ).fetchone()

        def _token_job(self, conn: Any) -> int:
            row = conn.execute("SELECT value FROM tenure_meta WHERE name = 'token'").fetchone()
            return int(row[0]) + 1

        def _blind_grant_job(
            self, conn: Any, key: bytes, owner: bytes, ttl_ms: int, token: int | None
        ) -> tuple[bool, bytes, int | None]:
            with self._write(conn):
                now = self._clock()
                if token is None:
                    # acquire-read-then-write: the write trusts the earlier read.
                    token = conn.execute(
                        "UPDATE tenure_meta SET value = value + 1 WHERE name = 'token' RETURNING value"
                    ).fetchone()[0]
                else:
                    row = conn.execute(
                        "SELECT owner, token, deadline FROM tenure_leases WHERE key = ?", (key,)
                    ).fetchone()
                    if row is not None and row[2] > now:
                        if row[0] != owner:
                            return False, row[0], None
                        token = row[1]
                    conn.execute(
                        "UPDATE tenure_meta SET value = max(value, ?) WHERE name = 'token'",
                        (token,),
                    )
                conn.execute(
                    "INSERT OR REPLACE INTO tenure_leases (key, owner, token, deadline) "
                    "VALUES (?, ?, ?, ?)",
                    (key, owner, token, now + ttl_ms / 1000),
                )
            return True, owner, token

        async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
            if name not in ("acquire-read-then-write", "token-outside-atomic"):
                return await super().acquire_lease(key, owner, ttl_ms)
            check_name(key, "key")
            check_name(owner, "owner")
            check_ttl(ttl_ms)
            self._check_open()
            k, o = key.encode(), owner.encode()
            token: int | None = None
            if name == "acquire-read-then-write":
                row = await self._run(self._read_job, k)
                if row is not None and row[2] > time.time():
                    if row[0] != o:
                        return AcquireResult(False, bytes(row[0]).decode(), None)
                    await super().acquire_lease(key, owner, ttl_ms)
                    return AcquireResult(True, owner, int(row[1]))
            else:
                token = await self._run(self._token_job)  # BUG: outside the grant
            await _race_window(ttl_ms)
            ok, holder, tok = await self._run(self._blind_grant_job, k, o, ttl_ms, token)
            if not ok:
                return AcquireResult(False, bytes(holder).decode(), None)
            return AcquireResult(True, owner, tok)

    return SqliteMutant.from_url(url)


# -- Redis ------------------------------------------------------------------------


def _redis_mutant(name: str, url: str) -> Any:
    from tenure.backends.redis import RedisStreamsPubSub

    class RedisMutant(RedisStreamsPubSub):
        async def release_lease(self, key: str, owner: str) -> None:
            if name != "release-plain-delete":
                return await super().release_lease(key, owner)
            self._check_open()
            await self._call("DEL", self._lease_key(key)[0])  # BUG: a plain DEL

        async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
            if name != "renew-no-owner-check":
                return await super().renew_lease(key, owner, ttl_ms)
            self._check_open()
            # BUG: PEXPIRE whoever holds it
            return bool(await self._call("PEXPIRE", self._lease_key(key)[0], ttl_ms))

        async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
            if name not in ("acquire-read-then-write", "token-outside-atomic"):
                return await super().acquire_lease(key, owner, ttl_ms)
            self._check_open()
            lease, counter = self._lease_key(key)
            if name == "acquire-read-then-write":
                value = await self._call("GET", lease)
                if value is not None:
                    _tok, _, holder = value.decode().partition(":")
                    if holder != owner:
                        return AcquireResult(False, holder, None)
                await _race_window(ttl_ms)
                token = int(await self._call("INCR", counter))
                # BUG: GET then SET, no atomic step between them
                await self._call("SET", lease, f"{token}:{owner}", "PX", ttl_ms)
                return AcquireResult(True, owner, token)
            last = await self._call("GET", counter)
            token = int(last or 0) + 1  # BUG: the token is read outside the grant
            await _race_window(ttl_ms)
            if await self._call("SET", lease, f"{token}:{owner}", "PX", ttl_ms, "NX"):
                await self._call("SET", counter, token)
                return AcquireResult(True, owner, token)
            return await super().acquire_lease(key, owner, ttl_ms)

    return RedisMutant.from_url(url)


# -- PostgreSQL -------------------------------------------------------------------


def _postgres_mutant(name: str, url: str) -> Any:
    from psycopg import sql

    from tenure.backends.postgres import PostgresLeaseProvider

    class PostgresMutant(PostgresLeaseProvider):
        def _t(self) -> sql.Composed:
            return sql.SQL("{}.{}").format(sql.Identifier(self.schema), sql.Identifier(self.table))

        async def _raw(self, query: sql.Composed, params: tuple[Any, ...]) -> list[Any]:
            await self._prepare("mutant")
            async with self._pool.connection() as conn:
                cur = await conn.execute(query, params)
                rows = await cur.fetchall() if cur.description is not None else []
                if not conn.autocommit:
                    await conn.commit()
                return rows

        async def release_lease(self, key: str, owner: str) -> None:
            if name != "release-plain-delete":
                return await super().release_lease(key, owner)
            self._check_open()
            # BUG: no ownership check
            await self._raw(
                sql.SQL("UPDATE {} SET owner = NULL WHERE key = %s").format(self._t()),
                (key.encode(),),
            )

        async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
            if name != "renew-no-owner-check":
                return await super().renew_lease(key, owner, ttl_ms)
            self._check_open()
            rows = await self._raw(
                sql.SQL(
                    # BUG: no owner in the WHERE clause
                    "UPDATE {} SET deadline = clock_timestamp() + %s * interval '1 millisecond' "
                    "WHERE key = %s AND owner IS NOT NULL AND deadline > clock_timestamp() RETURNING 1"
                ).format(self._t()),
                (ttl_ms, key.encode()),
            )
            return bool(rows)

        async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
            if name not in ("acquire-read-then-write", "token-outside-atomic"):
                return await super().acquire_lease(key, owner, ttl_ms)
            self._check_open()
            k, o = key.encode(), owner.encode()
            rows = await self._raw(
                sql.SQL(
                    "SELECT owner, token, deadline > clock_timestamp() FROM {} WHERE key = %s"
                ).format(self._t()),
                (k,),
            )
            row = rows[0] if rows else None
            if name == "acquire-read-then-write":
                if row is not None and row[0] is not None and row[2] and bytes(row[0]) != o:
                    return AcquireResult(False, bytes(row[0]).decode(), None)
                await _race_window(ttl_ms)
                # BUG: writes whatever the earlier read said was free
                rows = await self._raw(
                    sql.SQL(
                        "INSERT INTO {} AS t (key, owner, token, deadline) VALUES (%s, %s, 1, "
                        "clock_timestamp() + %s * interval '1 millisecond') ON CONFLICT (key) DO "
                        "UPDATE SET owner = excluded.owner, token = t.token + 1, "
                        "deadline = excluded.deadline RETURNING token"
                    ).format(self._t()),
                    (k, o, ttl_ms),
                )
                return AcquireResult(True, owner, int(rows[0][0]))
            token = (int(row[1]) if row is not None else 0) + 1  # BUG: outside the grant
            await _race_window(ttl_ms)
            rows = await self._raw(
                sql.SQL(
                    "INSERT INTO {} AS t (key, owner, token, deadline) VALUES (%s, %s, %s, "
                    "clock_timestamp() + %s * interval '1 millisecond') ON CONFLICT (key) DO "
                    "UPDATE SET owner = excluded.owner, token = excluded.token, "
                    "deadline = excluded.deadline WHERE t.owner IS NULL OR t.deadline <= clock_timestamp() "
                    "OR t.owner = excluded.owner RETURNING token"
                ).format(self._t()),
                (k, o, token, ttl_ms),
            )
            if rows:
                return AcquireResult(True, owner, int(rows[0][0]))
            return await super().acquire_lease(key, owner, ttl_ms)

    return PostgresMutant.from_url(url)


def open_backend(url: str, mutant: str | None = None) -> Any:
    """The backend for ``url``, or its ``mutant`` (a negative control) when named."""
    if mutant is None or mutant == "no-fencing":
        return tenure.from_url(url)
    if mutant not in BACKEND_MUTANTS:
        raise ValueError(f"unknown mutant {mutant!r}; known: {', '.join(MUTANTS)}")
    scheme = url.split("://", 1)[0].lower()
    if scheme == "memory":
        backend = _MemoryMutant()
        backend.mutant = mutant
        return backend
    if scheme == "sqlite":
        return _sqlite_mutant(mutant, url)
    if scheme in ("redis", "rediss"):
        return _redis_mutant(mutant, url)
    if scheme in ("postgresql", "postgres"):
        return _postgres_mutant(mutant, url)
    raise ValueError(f"no mutants for scheme {scheme!r}")
