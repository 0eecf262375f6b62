"""Building small histories by hand for the checker tests."""

from __future__ import annotations

import asyncio
from typing import Any

from safety.history import INF, Op
from safety.threads.runner import ThreadRunConfig, ThreadRunResult, run_threads

MS = 1_000_000


def mk(
    process: str,
    op: str,
    inv_ms: float,
    ret_ms: float | None,
    result: Any = None,
    *,
    token: int | None = None,
    typ: str = "ok",
    key: str = "k",
    **args: Any,
) -> Op:
    """One operation; ``ret_ms=None`` makes it ambiguous (``info``)."""
    if ret_ms is None:
        typ = "info"
    if "owner" not in args and op in ("acquire", "renew", "release"):
        args["owner"] = process
    return Op(
        process=process,
        key=key,
        op=op,
        args=args,
        type=typ,
        result=result,
        token=token,
        inv=inv_ms * MS,
        ret=INF if ret_ms is None else ret_ms * MS,
    )


def granted(owner: str = "") -> dict[str, Any]:
    return {"acquired": True, "owner": owner or None}


def denied(holder: str | None) -> dict[str, Any]:
    return {"acquired": False, "owner": holder}


def run_and_show(rc: ThreadRunConfig) -> ThreadRunResult:
    """A thread run of the harness, its figure line and violations printed (pytest -s)."""
    result = asyncio.run(run_threads(rc))
    print(result.figure_line())
    for line in result.report.describe():
        print("  " + line)
    return result
