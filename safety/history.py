"""The history format: one JSON line per event, one file per client process.

Each line is ``{"process", "key", "op", "args", "type", "result", "token", "t_ns"}``:

- ``op``: ``acquire`` | ``renew`` | ``release`` | ``transfer`` | ``get`` (lease operations)
  or ``read`` | ``write`` (the fenced counter store).
- ``type``: ``invoke`` (written *before* the call is sent), then exactly one of ``ok``
  (the call returned; ``result`` is its value), ``fail`` (the call certainly had no
  effect) or ``info`` (outcome unknown: timeout, lost connection, crash).
- ``t_ns``: ``time.monotonic_ns()``; one host, so every process shares the timeline.

A process runs one operation at a time. An ``invoke`` without a completion (the
process was killed, or its last line was cut) is read as ``info``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

__all__ = ["INF", "HistoryWriter", "Op", "group_by_key", "load_dir", "pair_events", "read_events"]

INF = math.inf

LEASE_OPS = frozenset({"acquire", "renew", "release", "transfer", "get"})


@dataclass(slots=True)
class Op:
    """One completed (or ambiguous) operation: an invoke paired with its completion.

    ``ret`` is ``INF`` for an ``info`` operation: it may take effect at any time
    after ``inv``, or never.
    """

    process: str
    key: str
    op: str
    args: dict[str, Any]
    type: str  # ok | fail | info
    result: Any
    token: int | None
    inv: float
    ret: float
    index: int = field(default=0)

    def describe(self) -> str:
        ret = "…" if self.ret == INF else f"{self.ret / 1e6:.3f}"
        return (
            f"[{self.inv / 1e6:.3f} → {ret} ms] {self.process} {self.op}"
            f"({', '.join(f'{k}={v!r}' for k, v in self.args.items())}) "
            f"{self.type} {self.result!r}"
            + (f" token={self.token}" if self.token is not None else "")
        )


class HistoryWriter:
    """Append events to a client's history file, flushed per line.

    Flushing each line means a SIGKILL loses at most the line being written;
    :func:`read_events` tolerates that cut line.
    """

    def __init__(self, path: Path, process: str) -> None:
        self._file: TextIO = path.open("a", encoding="utf-8")
        self.process = process

    def event(
        self,
        key: str,
        op: str,
        typ: str,
        t_ns: int,
        *,
        args: dict[str, Any] | None = None,
        result: Any = None,
        token: int | None = None,
        process: str | None = None,
    ) -> None:
        line = json.dumps(
            {
                "process": process or self.process,
                "key": key,
                "op": op,
                "args": args or {},
                "type": typ,
                "result": result,
                "token": token,
                "t_ns": t_ns,
            },
            separators=(",", ":"),
        )
        self._file.write(line + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_events(path: Path) -> Iterator[dict[str, Any]]:
    """The events of one file; a truncated or garbled line (a killed writer) is skipped."""
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                return
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def pair_events(events: Iterable[dict[str, Any]]) -> list[Op]:
    """Pair each invoke with the next completion of the same process.

    Raises ``ValueError`` on a malformed history (a completion without an invoke,
    or two invokes in flight for one process).
    """
    pending: dict[str, dict[str, Any]] = {}
    ops: list[Op] = []
    for ev in events:
        proc = ev["process"]
        if ev["type"] == "invoke":
            if proc in pending:
                raise ValueError(f"process {proc!r} invoked twice without a completion")
            pending[proc] = ev
            continue
        inv = pending.pop(proc, None)
        if inv is None:
            raise ValueError(f"completion without invoke for process {proc!r}: {ev}")
        typ = ev["type"]
        if typ not in ("ok", "fail", "info"):
            raise ValueError(f"unknown event type {typ!r}")
        ops.append(
            Op(
                process=proc,
                key=inv["key"],
                op=inv["op"],
                args=inv.get("args") or {},
                type=typ,
                result=ev.get("result"),
                token=ev.get("token"),
                inv=float(inv["t_ns"]),
                ret=INF if typ == "info" else float(ev["t_ns"]),
            )
        )
    ops.extend(
        Op(
            process=inv["process"],
            key=inv["key"],
            op=inv["op"],
            args=inv.get("args") or {},
            type="info",
            result=None,
            token=None,
            inv=float(inv["t_ns"]),
            ret=INF,
        )
        for inv in pending.values()
    )
    ops.sort(key=lambda o: o.inv)
    for i, o in enumerate(ops):
        o.index = i
    return ops


def load_dir(directory: Path) -> list[Op]:
    """Every operation recorded in ``directory/*.jsonl`` (one file per client)."""
    ops: list[Op] = []
    for path in sorted(directory.glob("*.jsonl")):
        ops.extend(pair_events(read_events(path)))
    ops.sort(key=lambda o: o.inv)
    for i, o in enumerate(ops):
        o.index = i
    return ops


def group_by_key(ops: Iterable[Op], *, lease_only: bool = True) -> dict[str, list[Op]]:
    """Operations per key, in invoke order (lease operations only by default)."""
    out: dict[str, list[Op]] = {}
    for o in ops:
        if lease_only and o.op not in LEASE_OPS:
            continue
        out.setdefault(o.key, []).append(o)
    return out
