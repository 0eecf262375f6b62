"""Flask under gunicorn ``--preload`` with several worker processes and threads: a counter under a lease.

    TENURE_URL=redis://127.0.0.1:6379/0 gunicorn --preload -w 3 -k gthread --threads 4 \\
        --chdir examples flask_counter:app

``POST /increment/<name>`` reads a counter, adds one and writes it back: a
read-modify-write that concurrent requests would spoil. Each request does it
under ``tenure.sync.hold`` on the counter's key, and writes with the lease's
fencing token to a store that rejects a lower token than it has seen (one Lua
script on Redis), so even a request paused past its lease could not overwrite
a newer value.

The backend is made, and used once, when the app is imported: with
``--preload`` that is in gunicorn's master process, before it forks the
workers. Each worker re-initialises it on its first call (its own
connections and loop thread); the workers' threads share it.
Settings come from the environment: ``TENURE_URL`` (a Redis URL here: the
counters live there too), ``TENURE_EXAMPLE_PREFIX``.
"""

from __future__ import annotations

import os
import threading
import uuid

from flask import Flask

import redis
import tenure.sync

PREFIX = os.environ.get("TENURE_EXAMPLE_PREFIX", "tenure-flask-example:")
URL = os.environ.get("TENURE_URL", "redis://127.0.0.1:6379/0")

app = Flask(__name__)
leases = tenure.sync.from_url(URL, prefix=PREFIX, quarantine=False)
leases.get_lease_owner("start-up check")  # connects here, in the master, before the fork
store = redis.Redis.from_url(URL)

# Applied only with a token at least the highest seen for the counter.
_FENCED_WRITE = store.register_script(
    """
    local seen = tonumber(redis.call('HGET', KEYS[1], 'token') or '-1')
    if tonumber(ARGV[1]) < seen then return 0 end
    redis.call('HSET', KEYS[1], 'token', ARGV[1], 'value', ARGV[2])
    return 1
    """
)


@app.post("/increment/<name>")
def increment(name: str) -> dict[str, object]:
    key = f"{PREFIX}counter:{name}"
    owner = f"{os.getpid()}-{threading.get_ident()}-{uuid.uuid4().hex[:6]}"
    with tenure.sync.hold(leases, f"counter:{name}", owner, ttl_ms=10_000, wait=None) as lease:
        assert lease.token is not None
        value = int(store.hget(key, "value") or 0) + 1
        lease.ensure_held()
        applied = bool(_FENCED_WRITE(keys=[key], args=[lease.token, value]))
    return {"value": value, "applied": applied, "token": lease.token, "pid": os.getpid()}
