"""Leases on PostgreSQL (``postgresql://``), with psycopg 3 and a connection pool.

Every lease operation is one SQL statement (``sql/*.sql`` in this package) in
its own short transaction. There are no advisory locks and no session state in
lease operations, so the pool may sit behind PgBouncer in transaction pooling
mode (see :class:`PostgresLeaseProvider` for the prepared-statement setting).

- ``_connection``: the pool, first use, the LISTEN connection and the one
  place where psycopg's errors become tenure's (secrets removed).
- ``_leases``: :class:`PostgresLeaseProvider`, the lease half on the shared core.
"""

# The driver first: when it is missing, this import fails naming psycopg,
# which from_url turns into "pip install 'tenure[postgres]'".
import psycopg  # noqa: F401

from ._leases import PostgresLeaseProvider

__all__ = ["PostgresLeaseProvider"]
