"""Thread output streams on Redis (``tenure.runtime`` replies): one stream per thread.

The stream sits next to the thread's lease key, in its hash slot (a cluster
runs the fenced append on one node). ``lua/output_append.lua`` checks the
lease's owner and token and appends in one script; readers wait with a
blocking ``XREAD``, which the server answers as soon as an entry lands.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..._errors import Fenced
from ._reading import _entries
from ._scripts import load_script

if TYPE_CHECKING:
    from ..._output import Retention, WriteFence
    from ._backend import RedisStreamsPubSub

__all__ = ["RedisOutput"]

_APPEND = load_script("output_append")


def _position(entry_id: Any) -> int:
    raw = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
    return int(raw.partition("-")[2])


class RedisOutput:
    """Output streams of one :class:`RedisStreamsPubSub`, on its connection."""

    def __init__(self, backend: RedisStreamsPubSub) -> None:
        self._backend = backend
        self._keys: dict[str, tuple[bytes, bytes]] = {}  # the last streams' (lease, output) keys

    def _keys_of(self, stream: str) -> tuple[bytes, bytes]:
        keys = self._keys.get(stream)
        if keys is None:
            if len(self._keys) >= 1024:
                self._keys.clear()
            lease, _ = self._backend._lease_key(stream)
            keys = self._keys[stream] = (lease, lease[: -len(b"lease")] + b"output")
        return keys

    def _key(self, stream: str) -> bytes:
        return self._keys_of(stream)[1]

    async def append(
        self, stream: str, fence: WriteFence, bodies: Sequence[str], retention: Retention
    ) -> int:
        backend = self._backend
        backend._check_open()
        lease, output = self._keys_of(fence.lease_key)[0], self._keys_of(stream)[1]
        args = [
            fence.owner.encode(),
            str(fence.token).encode(),
            retention.max_items,
            int(retention.max_age * 1000),
            *(b.encode() for b in bodies),
        ]
        last = int(await backend._eval(_APPEND, (lease, output), args))
        if last < 0:
            raise Fenced(fence.lease_key, fence.owner, "the lease is no longer this writer's")
        return last

    async def read(self, stream: str, after: int, limit: int) -> tuple[int, list[tuple[int, str]]]:
        backend = self._backend
        backend._check_open()
        key = self._key(stream)
        newest = await backend._call("XREVRANGE", key, "+", "-", "COUNT", 1)
        head = _position(newest[0][0]) if newest else 0
        if limit <= 0 or head <= after:
            return head, []
        entries = await backend._call("XRANGE", key, f"(0-{after}", "+", "COUNT", limit)
        return head, [(_position(i), _body(fields)) for i, fields in entries]

    async def wait(self, stream: str, after: int, timeout: float) -> list[tuple[int, str]]:
        backend = self._backend
        backend._check_open()
        reply = await backend._io(
            backend._client.xread,
            {self._key(stream): f"0-{after}"},
            count=256,
            block=max(1, int(timeout * 1000)),
            blocking=True,
        )
        return [(_position(i), _body(fields)) for i, fields in _entries(reply)]

    async def aclose(self) -> None:
        pass


def _body(fields: Any) -> str:
    if isinstance(fields, dict):
        raw = fields[b"b"]
    else:
        pairs = dict(zip(fields[::2], fields[1::2], strict=True))
        raw = pairs[b"b"]
    return raw.decode() if isinstance(raw, bytes) else str(raw)
