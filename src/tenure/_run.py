"""``tenure run KEY -- CMD``: a command under a lease, like ``flock(1)`` across hosts.

The lease is held while the command runs and renewed by :func:`tenure.hold`'s
renewer. The command gets ``TENURE_LEASE_KEY``, ``TENURE_LEASE_OWNER`` and
``TENURE_FENCING_TOKEN`` in its environment; it should hand the token to every
store it writes to, so that a write from a run that lost its lease is refused.

The command runs in a process group of its own. When the lease is lost (a
renewal refused, failed or late, or this process paused past the renew
deadline), the group gets SIGTERM, then SIGKILL after ``grace`` seconds, and
``tenure run`` exits 75. SIGINT, SIGTERM and SIGHUP sent to ``tenure run`` are
passed on to the group. The lease is released once the command has exited.
On Linux the command is also killed if ``tenure run`` itself dies (SIGKILL,
OOM): without its supervisor nobody would renew the lease, and another run
could start while this one went on.

Exit status: the command's own (``128 + N`` when signal N ended it); 73 when
the key is held by someone else (at once, or after ``--wait`` seconds); 75
when the lease was lost while the command ran; 69 when the backend cannot be
reached or is misconfigured; 127 or 126 when the command cannot be started.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from ._errors import BackendUnavailable, ConfigurationError, InvalidArgument, LeaseUnavailable
from ._hold import HeldLease, hold
from ._url import default_url, from_url
from ._url_options import redact_url

__all__ = ["EXIT_BUSY", "EXIT_LOST", "EXIT_UNAVAILABLE", "RunSettings", "run_command"]

EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE
EXIT_BUSY = 73  # EX_CANTCREAT
EXIT_LOST = 75  # EX_TEMPFAIL
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# Started in place of the command on Linux: asks the kernel to SIGKILL it when
# its parent (this process) dies, checks that the parent is still the one that
# started it, then becomes the command. (A preexec_fn is not safe here: the
# backends may run threads.)
_SHIM = """\
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    os._exit(1)
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except FileNotFoundError:
    sys.stderr.write(f"tenure run: command not found: {sys.argv[2]!r}\\n")
    os._exit(127)
except OSError as exc:
    sys.stderr.write(f"tenure run: cannot run {sys.argv[2]!r}: {exc.strerror or exc}\\n")
    os._exit(126)
"""


@dataclass(frozen=True)
class RunSettings:
    """What ``tenure run`` was asked to do."""

    key: str
    command: Sequence[str]
    url: str | None = None
    ttl_ms: int = 15_000
    wait: float | None = 0.0  # seconds to wait for a busy key; None: forever
    owner: str | None = None
    grace: float = 10.0  # seconds between SIGTERM and SIGKILL after a loss


def _say(message: str) -> None:
    print(f"tenure run: {message}", file=sys.stderr, flush=True)


def _signal_group(proc: asyncio.subprocess.Process, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass  # already gone


def run_command(settings: RunSettings) -> int:
    """Run ``settings.command`` under the lease; returns the exit status."""
    return asyncio.run(_run(settings))


async def _run(settings: RunSettings) -> int:
    if not settings.command:
        _say("no command given (tenure run KEY -- CMD [ARGS...])")
        return 2
    url = settings.url or default_url()
    if url.split("://", 1)[0].lower() == "memory":
        _say("memory:// lives inside one process: use a backend other processes share")
        return 2
    owner = settings.owner or f"{socket.gethostname()}:{os.getpid()}"
    try:
        backend = from_url(url)
    except (ConfigurationError, InvalidArgument) as exc:
        _say(str(exc))
        return EXIT_UNAVAILABLE
    try:
        async with backend:
            try:
                lease = await hold(
                    backend,
                    settings.key,
                    owner,
                    settings.ttl_ms,
                    wait=settings.wait,
                    cancel_on_loss=False,
                ).start()
            except LeaseUnavailable as exc:
                if exc.holder is None:
                    _say(
                        f"{settings.key!r} is not available (no holder: the backend refuses grants)"
                    )
                else:
                    _say(f"{settings.key!r} is held by {exc.holder!r}")
                return EXIT_BUSY
            try:
                return await _supervise(settings, lease)
            finally:
                try:
                    await lease.release()
                except BackendUnavailable as exc:
                    _say(f"could not release the lease (it expires within its TTL): {exc}")
    except (BackendUnavailable, ConfigurationError, InvalidArgument) as exc:
        _say(f"{exc} (backend {redact_url(url)})")
        return EXIT_UNAVAILABLE


async def _supervise(settings: RunSettings, lease: HeldLease) -> int:
    env = dict(os.environ)
    env["TENURE_LEASE_KEY"] = lease.key
    env["TENURE_LEASE_OWNER"] = lease.owner
    env["TENURE_FENCING_TOKEN"] = "" if lease.token is None else str(lease.token)
    argv = list(settings.command)
    if sys.platform == "linux":
        argv = [sys.executable, "-I", "-S", "-c", _SHIM, str(os.getpid()), *argv]
    # The handlers go in before the command starts: a signal that arrives while
    # it is being started (the command may already be running and telling others
    # so) is kept and passed on once it has started, instead of ending this
    # process with the command left behind.
    started: list[asyncio.subprocess.Process] = []
    early: list[int] = []

    def forward(sig: int) -> None:
        if started:
            _signal_group(started[0], sig)
        else:
            early.append(sig)

    loop = asyncio.get_running_loop()
    for sig in _FORWARDED:
        loop.add_signal_handler(sig, forward, sig)
    try:
        try:
            proc = await asyncio.create_subprocess_exec(*argv, env=env, start_new_session=True)
        except FileNotFoundError:
            _say(f"command not found: {settings.command[0]!r}")
            return 127
        except OSError as exc:
            _say(f"cannot run {settings.command[0]!r}: {exc.strerror or exc}")
            return 126
        started.append(proc)
        for early_sig in early:
            _signal_group(proc, early_sig)
        exited = asyncio.ensure_future(proc.wait())
        lost = asyncio.ensure_future(lease.lost.wait())
        # The renewer notices a loss on its own schedule; a look at the clock
        # between its steps catches a pause of this process at once.
        tick = min(0.25, lease.ttl_ms / 6000)
        try:
            while not exited.done():
                await asyncio.wait({exited, lost}, timeout=tick, return_when="FIRST_COMPLETED")
                if not exited.done() and not lease.held:
                    return await _stop(settings, lease, proc, exited)
        finally:
            lost.cancel()
        code = exited.result()
        return code if code >= 0 else 128 - code
    finally:
        for sig in _FORWARDED:
            loop.remove_signal_handler(sig)


async def _stop(
    settings: RunSettings,
    lease: HeldLease,
    proc: asyncio.subprocess.Process,
    exited: asyncio.Future[int],
) -> int:
    _say(f"lost the lease on {lease.key!r} ({lease.lost_reason}); stopping the command")
    _signal_group(proc, signal.SIGTERM)
    try:
        await asyncio.wait_for(asyncio.shield(exited), settings.grace)
    except TimeoutError:
        _say(f"the command did not stop within {settings.grace:g} s of SIGTERM; SIGKILL")
        _signal_group(proc, signal.SIGKILL)
        await exited
    return EXIT_LOST
