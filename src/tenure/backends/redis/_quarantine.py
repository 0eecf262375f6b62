"""The Redis backend's quarantine: has this server lost lease state of the prefix?

One epoch marker per prefix (per prefix and key slot on a cluster) and one
server-wide flush record, read and written by ``lua/epoch.lua`` in one
atomic step; the acquire script reads the marker on every new grant. The
rules, and what they cannot see, are in :class:`Quarantine`'s docstring.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from redis.crc import key_slot
from redis.exceptions import ResponseError

from ._connection import RedisConnection
from ._keys import _slot_tags, slot_tag
from ._scripts import load_script

__all__ = ["Quarantine"]

logger = logging.getLogger("tenure.redis")

_EPOCH = load_script("epoch")
MARKER = b"epoch"
# Outside every prefix: one per server (see Quarantine.flush_record_of).
_FLUSH_RECORD = b"tenure:flush-seen"


class Quarantine:
    """The state-loss check of one backend's prefix, and the quarantine it decides.

    ``ms`` is the quarantine's length (the prefix's ``max_ttl_ms``; 0: off).

    A Redis that loses data (a restart without persistence,
    ``FLUSHALL``/``FLUSHDB``, eviction, a failover to a replica that had not
    received the last grants) forgets leases that their holders still use;
    granting at once would give a key two owners. Each prefix has
    an epoch marker key ``<prefix>epoch`` (``"<quarantine end>:<replication
    ID>:<evicted keys>"``, no TTL). A new grant reads it in the acquire script
    (one ``GET``; nothing else on the hot path, unless the server's
    ``maxmemory-policy`` can evict, when the script also compares the
    server's ``evicted_keys`` with the marker's). Without the marker, or after
    an eviction, ``lua/epoch.lua`` decides in one script and records the
    answer in the marker: lease state may have been lost, and grants are
    refused for ``max_ttl_ms`` (+1 %; after a restart, counted from the
    server's start), when the marker is missing and this client saw it before
    (it remembers every marker a grant of its went through), or the server was
    promoted from a replica (``master_replid2`` set: a replica promoted before
    the prefix's first grant reached it has no marker, while that grant may be
    in use), or it started less than that ago without ``appendfsync always``,
    or its clock is behind its start time, or ``FLUSHALL``/``FLUSHDB`` ran
    less than ``max_ttl_ms`` before a tenure client first saw that it had run
    (see *Flushes* below; the later end counts when a young server was also
    flushed), or it has evicted keys; when the marker's replication ID is not
    the server's and the server was promoted from a replica (``master_replid2``), or restarted
    without ``appendfsync always``; when keys were evicted since the marker
    was written. Every new lease connection runs the same check before its
    first command, so after a failover (a reconnection) the first grant is
    already judged. A refused grant returns ``AcquireResult(acquired=False,
    owner=None, retry_after_ms=…, reason=RefusalReason.QUARANTINE)``, ``hold``
    and ``acquire_wait`` raise
    :class:`LeaseUnavailable` saying so, and one warning with the reason is
    logged per quarantine. Leases that survived are still named as held.

    *Flushes.* Redis does not say when a flush ran, only how many
    ``FLUSHALL``/``FLUSHDB`` calls it has served since it started. The first
    client that finds a marker missing after a new count records, once for
    the whole server, when it saw that count: the key ``tenure:flush-seen``
    in database 0 (outside every prefix, and read whatever the client's
    database; on a cluster one per key slot). Every flush counted ran before
    that time, so a lease it erased is over ``max_ttl_ms`` later: a prefix
    first used within that window is quarantined until its end, one first
    used after it is granted at once. A ``FLUSHDB`` of any database counts
    for all (Redis does not say which one was flushed). If the record cannot
    be read or written (an ACL that limits keys to the prefix), every flush
    counts as seen now, as if no client had seen it before.

    *When the server counts as new* (no quarantine at first contact): the
    marker is written in the same step as any grant of the prefix needs it,
    so its absence means no lease of the prefix was granted since it was
    lost. A server with ``appendonly yes`` and ``appendfsync always`` (read
    with ``CONFIG GET`` at first use; a server that refuses ``CONFIG`` does
    not count) keeps the marker across a restart, so if it is missing there
    and no flush or eviction happened since the start, the prefix was never
    used: the first grant is immediate. Without that persistence a server that
    started less than ``max_ttl_ms`` ago cannot tell a first use from a loss,
    and refuses for the rest of that window (pass ``quarantine=False`` for a
    throwaway server). A server up longer than ``max_ttl_ms`` with no sign of
    loss grants a new prefix at once.

    *Not detected*: an operator's ``DEL`` of lease keys, or of the marker
    when the client that asks next never saw it; a
    ``FLUSHALL`` followed by a restart of a durable server within
    ``max_ttl_ms`` (the restart clears the command statistics), or
    ``CONFIG RESETSTAT`` after a flush (a reset eviction count is taken as a
    possible eviction); a failover where the client keeps talking
    to the old address (a plain ``redis://`` URL whose host moved; Sentinel
    clients reconnect, and reconnecting runs the check; on a Cluster every
    new grant compares the replication ID). In those cases a key can have two
    owners for up to one TTL; fencing tokens still increase (see **Clock**).
    A restart from an RDB snapshot or an AOF without ``appendfsync always`` is
    seen through the server's new replication ID (Redis 7.0 draws a new one
    at start; a version that kept it across a restart would hide a
    snapshot's lost writes). For leases, run Redis with
    ``appendonly yes``, ``appendfsync always`` and ``maxmemory-policy
    noeviction``. ``quarantine=False`` turns all of this off (every acquire
    then skips the marker).
    """

    def __init__(
        self, conn: RedisConnection, prefix: str, *, quarantine_ms: int, instance: str
    ) -> None:
        self._conn = conn
        self._prefix = prefix
        self._p = prefix.encode("utf-8")
        self._instance = instance
        self.ms = quarantine_ms
        self.marker = self._p + MARKER
        # Where epoch.lua remembers when a flush was first seen: one record for
        # the whole server (database 0), whatever the prefix and database, so
        # a flush quarantines new prefixes only while a lease it may have
        # erased can still be live. On a cluster, one per slot.
        self._db = b"" if conn.cluster else b"%d" % conn.db
        # Epoch markers this client has seen on the server (a grant or a refusal
        # went through them): if one goes missing, state was lost (epoch.lua).
        self.seen_markers: set[bytes] = set()
        #: Local (event-loop clock) end of the last quarantine we were told about.
        self.deadline = 0.0
        # A cluster node's slots being put in quarantine together (_quarantine_node).
        self._node_sweep: asyncio.Task[None] | None = None
        if quarantine_ms and conn.pipe is not None:
            # A new connection may reach another server (a failover, a restart):
            # look at its marker before the first command.
            conn.pipe.on_connect = self.check_on

    async def when_free(self, timeout: float) -> bool:
        """Wait out a quarantine we know of (at most ``timeout``); whether it ended."""
        left = self.deadline - asyncio.get_running_loop().time()
        if left > 0:
            await asyncio.sleep(min(left, timeout))
            return left <= timeout
        return True

    def marker_of(self, lease: bytes) -> bytes:
        """The epoch marker for ``lease``: one per prefix; on a cluster, one per
        prefix and key slot (a script touches one slot)."""
        if self._conn.cluster:
            return self._p + b"{" + slot_tag(lease) + b"}:" + MARKER
        return self.marker

    def flush_record_of(self, marker: bytes) -> bytes:
        """The server-wide flush record (see ``epoch.lua``); on a cluster, the one
        in ``marker``'s slot."""
        if self._conn.cluster:
            return _FLUSH_RECORD + b":{" + marker.partition(b"{")[2].partition(b"}")[0] + b"}"
        return _FLUSH_RECORD

    async def check(self, marker: bytes | None = None) -> tuple[int, str]:
        """Run ``epoch.lua`` on ``marker`` (by default the prefix's; on a cluster,
        its first key slot's): has this server lost the prefix's lease state?

        Returns the quarantine left in ms (0: none) and its reason.
        """
        if marker is None:
            marker = self.marker_of(self._p + b"{}")
        reply = await self._conn.eval(
            _EPOCH,
            (marker, self.flush_record_of(marker)),
            (
                self.ms,
                b"1" if self._conn.durable else b"0",
                b"1" if marker in self.seen_markers else b"0",
                self._db,
            ),
        )
        left, reason = int(reply[0]), reply[1].decode("utf-8")
        self.note(left, reason)
        return left, reason

    def start_node_quarantine(self, lease: bytes) -> None:
        """Run :meth:`_quarantine_node` in the background (one at a time): it
        writes thousands of markers, which must not hold up the refusal."""
        if self._node_sweep is None or self._node_sweep.done():
            self._node_sweep = asyncio.get_running_loop().create_task(
                self._quarantine_node(lease), name=f"tenure-redis-quarantine-{self._instance}"
            )

    async def _quarantine_node(self, lease: bytes) -> None:
        """On a cluster, after ``lease``'s slot was found to have lost state: run
        the epoch check on the prefix's marker of every other slot of the same
        primary, all written at once (best effort).

        Markers are per slot, so each slot of a promoted (or restarted, or
        flushed) node would otherwise start its own quarantine at its own first
        grant, one ``max_ttl_ms`` after another. The loss happened before now
        for every slot of the node alike, so one quarantine from now covers
        them all: later first grants in those slots find it over.
        """
        try:
            # A failover moved many slots: learn them (a MOVED reply updates one).
            with self._conn.driver_errors:
                await self._conn.client.nodes_manager.initialize()
            slots = self._conn.client.nodes_manager.slots_cache
            owner = slots.get(key_slot(lease))
            if not owner:
                return
            tags = _slot_tags()
            markers = [
                self._p + b"{" + tags[slot] + b"}:" + MARKER
                for slot, nodes in slots.items()
                if nodes and nodes[0].name == owner[0].name and slot != key_slot(lease)
            ]
            # One key each (no flush record): a flush counts as seen now, as the
            # loss that started this sweep did.
            await self._conn.eval_per_key(
                _EPOCH,
                markers,
                (self.ms, b"1" if self._conn.durable else b"0", b"0", b""),
            )
        except Exception as exc:  # best effort: each slot still checks at its first grant
            logger.info("quarantining every slot of a Redis Cluster node failed: %r", exc)

    async def check_on(self, conn: Any) -> None:
        """``epoch.lua`` on a new lease connection (``Pipe.on_connect``)."""
        durable = b"1" if self._conn.durable else b"0"
        seen = b"1" if self.marker in self.seen_markers else b"0"
        await conn.send_command(
            "EVAL",
            _EPOCH.body,
            2,
            self.marker,
            _FLUSH_RECORD,
            self.ms,
            durable,
            seen,
            self._db,
        )
        try:
            reply = await conn.read_response()
        except ResponseError:
            return  # a replica (READONLY): every grant fails there anyway, and says why
        self.note(int(reply[0]), reply[1].decode("utf-8"))

    def note(self, left_ms: int, reason: str) -> None:
        """Remember (and log, once per quarantine) that grants are refused for ``left_ms``."""
        if left_ms <= 0:
            return
        loop = asyncio.get_running_loop()
        if loop.time() >= self.deadline or reason:
            logger.warning(
                "Redis at %s refuses new leases of prefix %r for %.1f s: it may have lost "
                "leases granted before (%s); a lease granted then can be in use until it "
                "expires (max_ttl_ms=%d)",
                self._conn.where,
                self._prefix,
                left_ms / 1000,
                reason or "a quarantine recorded on the server",
                self.ms,
            )
        self.deadline = loop.time() + left_ms / 1000

    def cancel_sweep(self) -> asyncio.Task[None] | None:
        """Stop a node quarantine under way (closing): the task to await, if any."""
        sweep, self._node_sweep = self._node_sweep, None
        if sweep is not None:
            sweep.cancel()
        return sweep
