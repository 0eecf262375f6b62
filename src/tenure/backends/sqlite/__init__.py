"""Leases and pub/sub for every process on one host, in one SQLite file.

The embedded default: no server to run. Every process that opens the same file
(workers, CLI invocations, local serverless emulators) sees the same leases and
the same event log, coordinated by SQLite's own file locking.

- ``_connection``: the worker thread and its connection (PRAGMAs, schema,
  change detection, the translation of ``sqlite3`` errors);
- ``_leases``: the lease half; ``_events``: the event half;
- ``_wake``: the wake-up datagrams between the instances sharing a file
  (a release or a publish wakes the others' waiters and subscribers);
- ``_backend``: :class:`SqlitePubSub`, the two halves on one connection, with
  the change detection that serves both and the options;
- ``sql/``: every statement, one file per operation (package data).
"""

from ._backend import SqlitePubSub

__all__ = ["SqlitePubSub"]
