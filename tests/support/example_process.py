"""An example application run for real by a test: its process group and the
JSON log it writes to a Redis list (shared by the integration tests)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest

import redis

__all__ = ["ExampleProcess"]


class ExampleProcess:
    """``proc`` writes JSON lines to the Redis list ``<prefix>log``; a subclass starts
    it (in a process group of its own) and says how to :meth:`stop` it."""

    proc: subprocess.Popen[bytes]

    def __init__(self, redis_url: str, prefix: str) -> None:
        self.prefix = prefix
        self.redis = redis.Redis.from_url(redis_url)

    def log(self) -> list[dict[str, Any]]:
        return [json.loads(item) for item in self.redis.lrange(f"{self.prefix}log", 0, -1)]

    def wait_for(self, check: Callable[[list[dict[str, Any]]], bool], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not check(self.log()):
            assert self.proc.poll() is None, self.output()
            if time.monotonic() > deadline:
                pytest.fail(f"condition not met within {timeout} s; log: {self.log()}")
            time.sleep(0.05)

    def output(self) -> str:
        """What the process printed (it is stopped first)."""
        self.stop()
        assert self.proc.stdout is not None
        return self.proc.stdout.read().decode(errors="replace")

    def stop(self) -> None:
        raise NotImplementedError
