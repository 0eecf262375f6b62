"""Leases and durable pub/sub on PostgreSQL (``postgresql://``), with psycopg 3 and a pool.

Every lease and event operation is one SQL statement (``sql/*.sql`` in this
package) in its own short transaction. There are no advisory locks and no
session state in them, so the pool may sit behind PgBouncer in transaction
pooling mode (see :class:`PostgresLeaseProvider` for the prepared-statement
setting). Only the one ``LISTEN`` connection needs a session.

- ``_connection``: the pool, first use, the LISTEN connection and the one
  place where psycopg's errors become tenure's (secrets removed).
- ``_leases``: :class:`PostgresLeaseProvider`, the lease half on the shared core.
- ``_events``: the event half (claims taken with ``SKIP LOCKED``, batched outcomes).
- ``_backend``: :class:`PostgresPubSub`, both halves; what ``from_url`` builds.
"""

# The driver first: when it is missing, this import fails naming psycopg,
# which from_url turns into "pip install 'tenure[postgres]'".
import psycopg  # noqa: F401

from ._backend import PostgresPubSub
from ._leases import PostgresLeaseProvider

__all__ = ["PostgresLeaseProvider", "PostgresPubSub"]
