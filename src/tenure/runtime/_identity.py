"""Who holds a thread's lease: a process, one of its sessions, and the session's phase.

The lease's owner string is ``"<process>/<session>.<phase>"``. Phase 0 is a
session still *opening* (its subscription may not exist yet, so senders wait);
phase ``n >= 1`` is the session's ``n``-th run, whose ``run_id`` is
``"<session>.<n>"``. This module is the one place that writes or reads that
format.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["Holder", "is_opening", "process_of", "run_of"]


@dataclass(frozen=True, slots=True)
class Holder:
    """One holder of a thread's lease, as its owner string encodes it."""

    process_id: str
    sid: str
    phase: int

    @property
    def owner(self) -> str:
        return f"{self.process_id}/{self.sid}.{self.phase}"

    @property
    def run_id(self) -> str:
        return f"{self.sid}.{self.phase}"

    @property
    def opening(self) -> bool:
        return self.phase == 0

    @property
    def session_prefix(self) -> str:
        """The start of every owner string of this session, whichever its phase."""
        return f"{self.process_id}/{self.sid}."

    def next(self) -> Holder:
        """The holder of the session's next phase (opened, or the next run)."""
        return replace(self, phase=self.phase + 1)

    @classmethod
    def parse(cls, owner: str) -> Holder | None:
        """The holder ``owner`` names, or ``None`` for an owner not in the runtime's format."""
        process_id, _, run_id = owner.rpartition("/")
        sid, dot, phase = run_id.rpartition(".")
        if not dot or not phase.isdigit() or not phase.isascii():
            return None
        return cls(process_id, sid, int(phase))


def run_of(owner: str | None) -> str | None:
    """The run id an owner string names (all of it after the last ``/``)."""
    return None if owner is None else owner.rpartition("/")[2]


def process_of(owner: str | None) -> str | None:
    """The process an owner string names (all of it before the last ``/``)."""
    return None if owner is None else owner.rpartition("/")[0]


def is_opening(owner: str | None) -> bool:
    """Whether ``owner`` is a session still opening (phase 0)."""
    holder = None if owner is None else Holder.parse(owner)
    return holder is not None and holder.opening
