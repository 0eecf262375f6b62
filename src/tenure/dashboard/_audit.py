"""The audit log: every action, who asked for it, when, on what, with which token.

Entries are JSON objects, one a line (JSON Lines), appended to a file when
the dashboard was given one (and flushed before the action's answer is
sent), and the latest kept in memory for the audit page.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from pathlib import Path
from typing import Any

from .._errors import ConfigurationError

__all__ = ["AuditLog"]


class AuditLog:
    def __init__(self, path: Path | None = None, keep: int = 1000) -> None:
        self.path = path
        self._recent: deque[dict[str, Any]] = deque(maxlen=keep)
        if path is not None:
            try:
                with path.open("a", encoding="utf-8"):
                    pass
            except OSError as exc:
                raise ConfigurationError(
                    f"cannot append to the audit log {str(path)!r}: {exc.strerror}"
                ) from None
            self._recent.extend(self._read_file()[-keep:])

    def write(self, **entry: Any) -> dict[str, Any]:
        """Record one action; ``at`` (UTC, ISO 8601) is added first."""
        stamped = {"at": _now(), **entry}
        if self.path is not None:
            line = json.dumps(stamped, ensure_ascii=False) + "\n"
            with self.path.open("a", encoding="utf-8") as out:
                out.write(line)
                out.flush()
                os.fsync(out.fileno())
        self._recent.append(stamped)
        return stamped

    def recent(self) -> list[dict[str, Any]]:
        """The latest entries, newest first."""
        return list(reversed(self._recent))

    def lines(self) -> str:
        """The whole log as JSON Lines (the file's when there is one)."""
        if self.path is not None:
            return self.path.read_text(encoding="utf-8")
        return "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in self._recent)

    def _read_file(self) -> list[dict[str, Any]]:
        assert self.path is not None
        found = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                found.append(json.loads(line))
            except ValueError:  # a line cut short by a crash is shown by lines(), not parsed
                continue
        return found


def _now() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
