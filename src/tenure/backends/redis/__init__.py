"""Leases and pub/sub on Redis: Lua scripts for leases, Streams for events.

- ``_connection``: the client, the pipelined lease connection, the first-use
  check, and the one translation of driver errors;
- ``_leases``: the lease half, one script of ``lua/`` per operation;
- ``_streams``: the event half (consumer groups on Redis Streams), whose
  subscriptions read through ``_reading``;
- ``_backend``: :class:`RedisStreamsPubSub`, the two halves on one connection,
  and :class:`RedisClusterPubSub`, the same on a Redis Cluster.
"""

from ._backend import RedisClusterPubSub, RedisStreamsPubSub
from ._connection import _tag as _tag  # the key encoding, which the tests check

__all__ = ["RedisClusterPubSub", "RedisStreamsPubSub"]
