"""``tenure run KEY -- CMD``: a command under a lease, like ``flock(1)`` across hosts.

The lease is held while the command runs and renewed by :func:`tenure.hold`'s
renewer. The command gets ``TENURE_LEASE_KEY``, ``TENURE_LEASE_OWNER`` and
``TENURE_FENCING_TOKEN`` in its environment; it should hand the token to every
store it writes to, so that a write from a run that lost its lease is refused.

The command runs in a process group of its own, owned by a keeper process
(``_keeper.py``) that stays between ``tenure run`` and the command. When the
lease is lost (a renewal refused, failed or late, or this process paused past
the renew deadline), the group gets SIGTERM, then SIGKILL after ``grace``
seconds, and ``tenure run`` exits 75 once every member of the group is gone.
When the command exits, what it left running in its group is stopped the same
way before the lease is released. SIGINT, SIGTERM and SIGHUP sent to
``tenure run`` are passed on to the group. If ``tenure run`` itself dies
(SIGKILL, OOM), the keeper SIGKILLs the group at once: without its supervisor
nobody would renew the lease, and another run could start while this one went
on; if the keeper alone is killed, ``tenure run`` SIGKILLs the group itself.
A process that leaves the group (``setsid``, a daemon) escapes all this.

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
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ._errors import BackendUnavailable, ConfigurationError, InvalidArgument, LeaseUnavailable
from ._hold import HeldLease, hold
from ._url import default_url, from_url
from ._url_options import redact_url

__all__ = ["EXIT_BUSY", "EXIT_LOST", "EXIT_UNAVAILABLE", "RunSettings", "run_command"]

EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE
EXIT_BUSY = 73  # EX_CANTCREAT
EXIT_LOST = 75  # EX_TEMPFAIL
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# Started in place of the command: it owns the command's process group (see
# its docstring). Run by path with -I -S, so nothing from the environment or
# site-packages comes between.
_KEEPER = str(Path(__file__).with_name("_keeper.py"))


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
                # The message says why: the holder, or the backend's refusal and for how long.
                _say(f"{exc} (refused: {exc.reason or 'unknown reason'})")
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


def _environment(lease: HeldLease) -> dict[str, str]:
    env = dict(os.environ)
    env["TENURE_LEASE_KEY"] = lease.key
    env["TENURE_LEASE_OWNER"] = lease.owner
    env["TENURE_FENCING_TOKEN"] = "" if lease.token is None else str(lease.token)
    return env


async def _supervise(settings: RunSettings, lease: HeldLease) -> int:
    # The keeper reads what to do from this pipe, and end-of-file when this
    # process dies, however it dies. Only the keeper holds its read end. On the
    # other pipe it tells the command's process group, read only if it dies.
    control, orders = os.pipe()
    news, told = os.pipe()

    def order(word: str) -> None:
        try:
            os.write(orders, f"{word}\n".encode())
        except OSError:
            pass  # the keeper is gone; _ended sees to its group

    # The handlers go in before the command starts: a signal that arrives while
    # it is being started waits in the pipe and is passed on once it has
    # started, instead of ending this process with the command left behind.
    loop = asyncio.get_running_loop()
    for sig in _FORWARDED:
        loop.add_signal_handler(sig, order, str(int(sig)))
    try:
        keeper = [sys.executable, "-I", "-S", _KEEPER, str(control), str(told)]
        try:
            proc = await asyncio.create_subprocess_exec(
                *keeper,
                repr(settings.grace),
                *settings.command,
                env=_environment(lease),
                start_new_session=True,
                pass_fds=(control, told),
            )
        finally:
            os.close(control)
            os.close(told)
        exited = asyncio.ensure_future(proc.wait())
        lost = asyncio.ensure_future(lease.lost.wait())
        # The renewer notices a loss on its own schedule; a look at the clock
        # between its steps catches a pause of this process at once.
        tick = min(0.25, lease.ttl_ms / 6000)
        try:
            while not exited.done():
                await asyncio.wait({exited, lost}, timeout=tick, return_when="FIRST_COMPLETED")
                if not exited.done() and not lease.held:
                    _say(
                        f"lost the lease on {lease.key!r} ({lease.lost_reason}); stopping the command"
                    )
                    order("stop")
                    await _ended(exited, news, settings.grace)
                    return EXIT_LOST
        finally:
            lost.cancel()
        code = await _ended(exited, news, settings.grace)
        return code if code >= 0 else 128 - code
    finally:
        for sig in _FORWARDED:
            loop.remove_signal_handler(sig)
        os.close(orders)
        os.close(news)


async def _ended(exited: asyncio.Future[int], news: int, grace: float) -> int:
    """The keeper's exit status, once it and the command's group are gone.

    The keeper exits only once the group is empty, unless it was killed itself:
    then the group it owned is SIGKILLed here, and waited for up to ``grace``.
    """
    code = await exited
    told = os.read(news, 32).split()  # the keeper is gone: no wait
    if code >= 0 or not told:
        return code
    pgid = int(told[0])
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return code
    _say(f"the keeper died of signal {-code}: SIGKILL to the command's group")
    give_up = time.monotonic() + grace
    while time.monotonic() < give_up:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            break
        await asyncio.sleep(0.05)
    return code
