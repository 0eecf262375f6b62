"""Leases and pub/sub on Redis: Lua scripts for leases, Streams for events.

- ``_client``: the redis-py client built from a URL (retries off);
- ``_pipe``: the pipelined transport of lease commands;
- ``_errors``: the one translation of driver errors;
- ``_scripts`` and ``_keys``: the Lua scripts of ``lua/``, the key encoding;
- ``_connection``: :class:`RedisConnection`, the first-use check and every
  command sent, through the transport or redis-py's pool;
- ``_leases``: the lease half, one script of ``lua/`` per operation;
- ``_streams``: the event half (consumer groups on Redis Streams), whose
  subscriptions read through ``_reading``;
- ``_backend``: :class:`RedisStreamsPubSub`, the two halves on one connection,
  and :class:`RedisClusterPubSub`, the same on a Redis Cluster.
"""

from ._backend import RedisClusterPubSub, RedisStreamsPubSub
from ._keys import _tag as _tag  # the key encoding, which the tests check

__all__ = ["RedisClusterPubSub", "RedisStreamsPubSub"]
