"""Leases on etcd v3 (``etcd://``, ``etcds://``): one transaction per change,
revisions as fencing tokens, a watch for release wake-ups. No events.

- ``_connection``: the gRPC channel to every member, the URL, and the one
  translation of gRPC's errors;
- ``_leases``: :class:`EtcdLeases`.
"""

from ._leases import EtcdLeases

__all__ = ["EtcdLeases"]
