"""A plain threaded program: 32 threads increment one counter, each increment under a lease.

    python examples/threaded_counter.py                        # in memory
    python examples/threaded_counter.py sqlite:///tmp/counter.db
    python examples/threaded_counter.py redis://127.0.0.1:6379/0

Each increment is a read, a pause and a write: without the lease, threads would
overwrite each other's increments. Every write goes to a fenced store with the
lease's token, which rejects a token lower than the highest it has seen (a
holder that lost its lease could never overwrite its successor). At the end
the count must be exactly threads x increments, no write rejected; the exit
status says so.
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import tenure.sync


class FencedCounter:
    """A counter store that applies a write only with a token at least the highest seen."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value = 0
        self._token = -1
        self.rejected = 0

    def read(self) -> int:
        with self._lock:
            return self._value

    def write(self, value: int, token: int) -> bool:
        with self._lock:
            if token < self._token:
                self.rejected += 1
                return False
            self._token, self._value = token, value
            return True


def run(url: str, threads: int, increments: int, ttl_ms: int) -> tuple[int, int]:
    """Returns (count, rejected writes)."""
    counter = FencedCounter()
    key = f"counter-{uuid.uuid4().hex[:8]}"

    def worker(n: int) -> None:
        for _ in range(increments):
            with tenure.sync.hold(backend, key, f"thread-{n}", ttl_ms, wait=None) as lease:
                assert lease.token is not None
                value = counter.read()
                time.sleep(0)  # give another thread every chance to interleave
                lease.ensure_held()
                counter.write(value + 1, lease.token)

    with tenure.sync.from_url(url) as backend, ThreadPoolExecutor(threads) as pool:
        for future in [pool.submit(worker, n) for n in range(threads)]:
            future.result()
    return counter.read(), counter.rejected


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?", default="memory://")
    parser.add_argument("--threads", type=int, default=32)
    parser.add_argument("--increments", type=int, default=20)
    parser.add_argument("--ttl-ms", type=int, default=10_000)
    args = parser.parse_args()
    started = time.perf_counter()
    count, rejected = run(args.url, args.threads, args.increments, args.ttl_ms)
    expected = args.threads * args.increments
    elapsed = time.perf_counter() - started
    print(f"count {count}, expected {expected}, rejected writes {rejected}, {elapsed:.2f} s")
    ok = count == expected and rejected == 0
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
