"""How keys are written on Redis: the injective hash-tag encoding and, for a
Redis Cluster, a short hash tag in each key slot."""

from __future__ import annotations

from binascii import crc_hqx

from redis.crc import key_slot

__all__ = ["_slot_tags", "_tag", "slot_tag"]


def _tag(name: str) -> bytes:
    """``name`` as UTF-8 with ``%``, ``{`` and ``}`` percent-escaped.

    Injective, and free of braces, so it can sit inside a hash tag (which ends
    at the first ``}``) and be told apart from the fixed suffixes after it.
    """
    raw = name.encode("utf-8")
    if b"%" in raw or b"{" in raw or b"}" in raw:
        raw = raw.replace(b"%", b"%25").replace(b"{", b"%7B").replace(b"}", b"%7D")
    return raw


_SLOT_TAGS: list[bytes] = []


def _slot_tags() -> list[bytes]:
    """For each of a Redis Cluster's 16384 key slots, a short hash tag in it
    (found by counting in hex; about 0.3 s, once per process)."""
    if not _SLOT_TAGS:
        tags: list[bytes | None] = [None] * 16384
        left, i = 16384, 0
        while left:
            tag = b"%x" % i
            slot = crc_hqx(tag, 0) % 16384
            if tags[slot] is None:
                tags[slot] = tag
                left -= 1
            i += 1
        _SLOT_TAGS[:] = [t for t in tags if t is not None]
    return _SLOT_TAGS


def slot_tag(key: bytes) -> bytes:
    """A hash tag in the key slot of ``key`` (a key whose tag is ``{<key's tag>}``)."""
    return _slot_tags()[key_slot(key)]
