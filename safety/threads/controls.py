"""Negative controls: the runtime broken in one worker process, each the way a real bug breaks it.

Applied by a worker started with ``--control NAME`` (:func:`apply`), before it
builds its runtimes; nothing in ``tenure`` can turn them on. Each must be caught
by the checkers of :mod:`safety.threads.checker`:

- ``never-lose``: the renewer never declares a loss (``Renewer.check`` always
  passes, ``Renewer.lose`` does nothing), so a run goes on after a pause past
  its TTL or while its renewals hang. Caught as overlaps (a stale run's write
  after its successor's), or as lost signals (the process never hands its
  threads back); a run shows one or both.
- ``no-reclaim``: a new owner does not take back a dead owner's unfinished
  signals and the sweep finds no thread with unfinished signals (the backend's
  ``reclaim`` returns 0, ``backlog`` returns ``[]``): redelivery falls back to
  the backend's 30 s timeout. Caught as lost signals.
- ``collide``: thread names are ``f"{namespace}:{thread_key}"`` as before the
  injective names, so ``("app", "v2:42")`` and ``("app:v2", "42")`` share one
  lease and one topic. Caught as misrouted signals.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CONTROLS", "apply", "apply_to_backend"]

CONTROLS = ("never-lose", "no-reclaim", "collide")


def apply(name: str | None) -> None:
    """Patch this process's runtime for control ``name`` (``None``: the real runtime)."""
    if name is None:
        return
    if name not in CONTROLS:
        raise ValueError(f"unknown control {name!r}; one of {', '.join(CONTROLS)}")
    if name == "never-lose":
        from tenure._renewer import Renewer

        def check(self: Renewer) -> bool:
            return True

        def lose(self: Renewer, reason: str) -> None:
            return None

        Renewer.check = check  # type: ignore[method-assign]  # the control's bug
        Renewer.lose = lose  # type: ignore[method-assign]  # the control's bug
    elif name == "collide":
        from tenure._validate import check_name
        from tenure.runtime._names import ThreadNames

        init = ThreadNames.__init__

        def __init__(self: ThreadNames, namespace: str) -> None:
            init(self, namespace)
            self.prefix = namespace + ":"

        def name_of(self: ThreadNames, thread_key: str) -> str:
            return f"{self.namespace}:{check_name(thread_key, 'thread_key')}"

        def thread_of(self: ThreadNames, name: str) -> str | None:
            if not name.startswith(self.prefix) or len(name) == len(self.prefix):
                return None
            return name[len(self.prefix) :]

        ThreadNames.__init__ = __init__  # type: ignore[method-assign]  # the control's bug
        ThreadNames.name = name_of  # type: ignore[method-assign]  # the control's bug
        ThreadNames.thread_of = thread_of  # type: ignore[method-assign]  # the control's bug


def apply_to_backend(name: str | None, backend: Any) -> None:
    """The part of control ``name`` that lives in the backend object (``no-reclaim``)."""
    if name != "no-reclaim":
        return

    async def reclaim(topic: str, group: str) -> int:
        return 0

    async def backlog(prefix: str, group: str) -> list[str]:
        return []

    backend.reclaim = reclaim
    backend.backlog = backlog
