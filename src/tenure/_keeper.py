"""The keeper of ``tenure run``'s command: a small process between the two.

``tenure run`` starts this file (``python -I -S _keeper.py CONTROL NEWS GRACE CMD...``)
instead of the command. It starts the command in a process group of its own
and owns that group until every member is gone:

- it passes on what ``tenure run`` writes to the CONTROL pipe: a signal number
  is sent to the group, ``stop`` sends SIGTERM and SIGKILL ``GRACE`` seconds
  later (the lease was lost);
- when ``tenure run`` dies, however it dies, the pipe reads end-of-file and the
  group is SIGKILLed at once: nobody renews the lease any more;
- when the command exits, what it left running in its group gets SIGTERM, and
  SIGKILL ``GRACE`` seconds later: nothing of a run outlives its lease;
- it writes the group's id to the NEWS pipe, so that ``tenure run`` can end
  the group should this keeper be killed;
- on Linux it is a child subreaper, so the group's orphans become its children
  and are reaped here, and "the group is empty" is known, not guessed.

It exits once the group is empty, with the command's status (``128 + N`` when
signal N ended it). Only the standard library: it runs with ``-I -S``. A
process that leaves the group (``setsid``, ``setpgid``: a daemon) is out of
its reach.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import time

_PR_SET_CHILD_SUBREAPER = 36


def _say(message: str) -> None:
    try:
        sys.stderr.write(f"tenure run: {message}\n")
        sys.stderr.flush()
    except OSError:
        pass  # whoever read our stderr is gone; the work goes on


def _exec(argv: list[str]) -> None:
    """In the forked child: a group of its own, default signals, then the command."""
    try:
        os.setpgid(0, 0)
        signal.set_wakeup_fd(-1)
        # Python ignores these at start-up, and an ignored signal stays ignored
        # across exec: the command would not die of a closed pipe as it should.
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        os.execvp(argv[0], argv)
    except FileNotFoundError:
        _say(f"command not found: {argv[0]!r}")
        os._exit(127)
    except OSError as exc:
        _say(f"cannot run {argv[0]!r}: {exc.strerror or exc}")
        os._exit(126)
    finally:
        os._exit(126)


class _Group:
    """The command's process group, as this keeper sees it."""

    def __init__(self, pgid: int, grace: float) -> None:
        self.pgid = pgid
        self.grace = grace
        self.status: int | None = None  # the command's exit code, once it exited
        self.kill_at: float | None = None  # when SIGKILL is due after a SIGTERM
        self.killed = False

    def send(self, sig: int) -> None:
        try:
            os.killpg(self.pgid, sig)
        except ProcessLookupError:
            pass  # nobody left

    def alive(self) -> bool:
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True  # a member changed its credentials: still a member
        return True

    def reap(self) -> None:
        """Collect every exited child: the command and the orphans handed to us."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.pgid:
                self.status = os.waitstatus_to_exitcode(status)

    def terminate(self, why: str) -> None:
        """SIGTERM now, SIGKILL after the grace (once; a later call keeps the first deadline)."""
        if self.kill_at is None and not self.killed:
            if why:
                _say(why)
            self.send(signal.SIGTERM)
            self.kill_at = time.monotonic() + self.grace

    def kill(self, why: str) -> None:
        self.send(signal.SIGKILL)
        if not self.killed:
            self.killed = True
            _say(why)

    def due(self) -> float | None:
        """Seconds until SIGKILL is due (``None``: nothing due)."""
        if self.kill_at is None or self.killed:
            return None
        return max(0.0, self.kill_at - time.monotonic())


def _control(group: _Group, data: bytes) -> None:
    for word in data.split():
        if word == b"stop":
            group.terminate("")
        elif word.isdigit():
            group.send(int(word))


def main(argv: list[str]) -> int:
    control, news, grace, command = int(argv[0]), int(argv[1]), float(argv[2]), argv[3:]
    os.set_inheritable(control, False)
    os.set_inheritable(news, False)
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    pid = os.fork()
    if pid == 0:
        _exec(command)
    try:
        os.setpgid(pid, pid)  # also here, so no signal finds the group missing
    except OSError:
        pass  # the child has set it already, or has exec'd
    try:
        os.write(news, f"{pid}\n".encode())
    except OSError:
        pass  # tenure run is gone: the control pipe says so next
    os.close(news)
    group = _Group(pid, grace)
    watched = [control, wake_r]
    while True:
        group.reap()
        if group.status is not None:
            if not group.alive():
                return group.status if group.status >= 0 else 128 - group.status
            group.terminate("the command exited and left processes in its group: SIGTERM")
        wait = group.due()
        if wait == 0:
            group.kill(f"the command's group did not stop within {grace:g} s of SIGTERM; SIGKILL")
        if group.killed:
            wait = 0.05  # SIGKILL is under way: look again soon, whoever gets to reap
        ready, _, _ = select.select(watched, [], [], wait)
        if wake_r in ready:
            os.read(wake_r, 512)
        if control in ready:
            data = os.read(control, 512)
            if data:
                _control(group, data)
            else:  # tenure run is gone: nobody renews the lease
                watched.remove(control)
                group.kill("tenure run is gone: SIGKILL to the command's group")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
