"""Running a function in a really forked child of the test process."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

__all__ = ["in_child"]


def in_child(fn: Callable[[], Any]) -> Any:
    """``fn()`` in a forked child; its JSON result, or its error as ``{"error": ...}``."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read)
            try:
                payload = {"result": fn()}
            except BaseException as exc:
                payload = {"error": f"{type(exc).__name__}: {exc}"}
            os.write(write, json.dumps(payload).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return json.loads(data)
