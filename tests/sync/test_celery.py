"""Celery prefork workers running ``examples/celery_singleton.py`` for real, on a Redis
broker and on a RabbitMQ broker (``TENURE_TEST_AMQP_URL``, the shared server at
127.0.0.1:5672 by default). The leases and the fenced store are on Redis in both.

Duplicate deliveries (a task sent several times, a worker child killed with
``acks_late``) never run at once for one key, and a run paused past its lease
writes nothing over its successor: the fenced store rejects its token.
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.example_process import ExampleProcess
from tests.support.servers import AMQP_URL, require_tcp

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TTL_MS = 1500


class Worker(ExampleProcess):
    def __init__(self, redis_url: str, broker_url: str, prefix: str) -> None:
        super().__init__(redis_url, prefix)
        self.broker_url = broker_url
        env = {
            **os.environ,
            "TENURE_URL": redis_url,
            "CELERY_BROKER_URL": broker_url,
            "TENURE_EXAMPLE_PREFIX": prefix,
            "TENURE_EXAMPLE_TTL_MS": str(TTL_MS),
        }
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "--workdir",
                str(EXAMPLES),
                "-A",
                "celery_singleton",
                "worker",
                "--pool=prefork",
                "--concurrency=3",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "--loglevel=warning",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        celery: Any = importlib.import_module("celery")
        self.client = celery.Celery("client", broker=broker_url)
        if broker_url.startswith("redis"):  # as the example's worker does
            self.client.conf.broker_transport_options = {"global_keyprefix": prefix}

    def send(self, invoice: str, **kwargs: Any) -> None:
        self.client.send_task(
            "celery_singleton.bill",
            args=[invoice],
            kwargs=kwargs,
            queue=f"{self.prefix}queue",
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def close(self) -> None:
        self.stop()
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        if self.broker_url.startswith("amqp"):  # the queue outlives its consumers there
            with self.client.connection_for_write() as conn:
                conn.default_channel.queue_delete(f"{self.prefix}queue")
        self.client.close()
        # Ours and, on a Redis broker, the broker's (its global_keyprefix is ours).
        keys = list(self.redis.scan_iter(match=self.prefix.replace(":", "\\:") + "*"))
        if keys:
            self.redis.delete(*keys)
        self.redis.close()


@pytest.fixture(params=["redis", "rabbitmq"])
def worker(request: pytest.FixtureRequest, redis_url: str, unique: str) -> Iterator[Worker]:
    broker = redis_url if request.param == "redis" else require_tcp(AMQP_URL, "RabbitMQ")
    worker = Worker(redis_url, broker, f"tenure-test-{unique}:")
    try:
        yield worker
    finally:
        worker.close()


def steps(log: list[dict[str, Any]], invoice: str, step: str | None = None) -> list[dict[str, Any]]:
    return [e for e in log if e["invoice"] == invoice and (step is None or e["step"] == step)]


def test_duplicates_never_overlap_and_a_stale_run_cannot_overwrite(worker: Worker) -> None:
    # Duplicate sends: three workers, one invoice at a time.
    for _ in range(4):
        worker.send("A", work=0.1)
        worker.send("B", work=0.1)
    worker.wait_for(lambda log: len([e for e in log if e["step"] == "write"]) == 8)
    for invoice in ("A", "B"):
        runs = steps(worker.log(), invoice)
        assert [e["step"] for e in runs] == ["start", "write"] * 4, runs
        tokens = [e["token"] for e in runs[::2]]
        assert [e["token"] for e in runs[1::2]] == tokens and tokens == sorted(set(tokens))
        assert all(e["applied"] for e in runs[1::2])

    # A worker child killed mid-run: acks_late sends the task again; the new run
    # waits for the dead run's lease to expire and takes over with a higher token.
    worker.send("C", work=3)  # delivered again after the kill: long enough to be killed
    worker.wait_for(lambda log: len(steps(log, "C", "start")) == 1)
    killed = steps(worker.log(), "C", "start")[0]
    os.kill(killed["pid"], signal.SIGKILL)
    worker.send("C", work=0.1)  # and a client's retry on top
    worker.wait_for(lambda log: len(steps(log, "C", "write")) == 2)
    runs = steps(worker.log(), "C")
    assert [e["step"] for e in runs] == ["start"] + ["start", "write"] * 2, runs
    assert [e["token"] for e in runs] == sorted(e["token"] for e in runs)
    assert runs[1]["token"] > killed["token"]

    # A run paused between its check and its write, past its lease: its successor
    # writes first, and the store rejects the late write of the stale token.
    worker.send("D", work=0.1, pause=True)
    worker.wait_for(lambda log: len(steps(log, "D", "pausing")) == 1)
    stale = steps(worker.log(), "D", "pausing")[0]
    worker.send("D", work=0.1)
    worker.wait_for(lambda log: len(steps(log, "D", "write")) == 1)
    successor = steps(worker.log(), "D", "write")[0]
    assert successor["applied"] and successor["token"] > stale["token"]
    os.kill(stale["pid"], signal.SIGCONT)
    worker.wait_for(lambda log: len(steps(log, "D", "write")) == 2)
    late = steps(worker.log(), "D", "write")[1]
    assert (late["pid"], late["token"], late["applied"]) == (stale["pid"], stale["token"], False)
    stored = worker.redis.hgetall(f"{worker.prefix}invoice:D")
    assert stored == {
        b"token": str(successor["token"]).encode(),
        b"value": f"by {successor['pid']}".encode(),
    }
