"""Celery prefork workers, with a task guarded by ``@tenure.sync.singleton``.

    TENURE_URL=redis://127.0.0.1:6379/0 celery --workdir examples -A celery_singleton \\
        worker --pool=prefork --concurrency=3

The broker is Redis by default; ``CELERY_BROKER_URL=amqp://guest:guest@127.0.0.1:5672//``
runs the same on RabbitMQ (the leases and the fenced store stay on Redis).

Celery delivers a task at least once: with ``acks_late`` a task whose worker
died is delivered again, and a client may send the same task twice. Here
``bill(invoice)`` must never run twice at once for one invoice, and a run that
was paused past its lease (a stopped VM, a long GC) must not overwrite its
successor's result:

- ``@tenure.sync.singleton`` holds the invoice's lease for the whole run;
  a duplicate waits for it (``wait=None``), and takes it over when a dead
  worker's lease expires;
- the run writes its result to a fenced store with the lease's token, and the
  store (one Lua script on Redis) rejects a token lower than the highest it has
  seen.

The backend is made at import, in Celery's main process, before it forks its
pool: each child re-initialises it on its first call. Every step is recorded
in a Redis list (``<prefix>log``), which the test reads to check the runs.
Settings come from the environment: ``TENURE_URL`` (leases), ``CELERY_BROKER_URL``,
``TENURE_EXAMPLE_PREFIX`` (keys of this run), ``TENURE_EXAMPLE_TTL_MS``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

from celery import Celery

import redis
import tenure.sync

PREFIX = os.environ.get("TENURE_EXAMPLE_PREFIX", "tenure-celery-example:")
TTL_MS = int(os.environ.get("TENURE_EXAMPLE_TTL_MS", "10000"))
REDIS_URL = os.environ.get("TENURE_URL", "redis://127.0.0.1:6379/0")
BROKER_URL = os.environ.get("CELERY_BROKER_URL", REDIS_URL)

app = Celery("celery_singleton", broker=BROKER_URL)
app.conf.update(
    task_acks_late=True,  # a task is acknowledged when it ends, so a killed run comes back
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_default_queue=f"{PREFIX}queue",
    broker_connection_retry_on_startup=True,
)
if BROKER_URL.startswith(("redis://", "rediss://")):
    # Every key the broker writes (queues, bindings, the workers' control
    # channel) under this run's prefix too, so nothing is left outside it.
    app.conf.broker_transport_options = {"global_keyprefix": PREFIX}

leases = tenure.sync.from_url(REDIS_URL, prefix=PREFIX, quarantine=False)
store = redis.Redis.from_url(REDIS_URL)

# The fenced write: applied only with a token at least the highest seen for the key.
_FENCED_WRITE = store.register_script(
    """
    local seen = tonumber(redis.call('HGET', KEYS[1], 'token') or '-1')
    if tonumber(ARGV[1]) < seen then return 0 end
    redis.call('HSET', KEYS[1], 'token', ARGV[1], 'value', ARGV[2])
    return 1
    """
)


def record(step: str, **fields: Any) -> None:
    store.rpush(f"{PREFIX}log", json.dumps({"step": step, "pid": os.getpid(), **fields}))


@app.task
@tenure.sync.singleton(leases, key=lambda invoice, **_: f"invoice:{invoice}", ttl_ms=TTL_MS)
def bill(invoice: str, work: float = 0.1, pause: bool = False) -> bool:
    lease = tenure.sync.current_lease()
    assert lease.token is not None
    record("start", invoice=invoice, token=lease.token, at=time.time())
    time.sleep(work)  # the work: the lease is renewed meanwhile
    lease.ensure_held()
    if pause:
        # A pause falling between the check and the write (the test resumes us).
        record("pausing", invoice=invoice, token=lease.token)
        os.kill(os.getpid(), signal.SIGSTOP)
    applied = bool(
        _FENCED_WRITE(keys=[f"{PREFIX}invoice:{invoice}"], args=[lease.token, f"by {os.getpid()}"])
    )
    record("write", invoice=invoice, token=lease.token, applied=applied)
    return applied
