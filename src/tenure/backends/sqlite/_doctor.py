"""What ``tenure doctor`` checks on a SQLite file (see :mod:`tenure._doctor`)."""

from __future__ import annotations

import os
import stat
import sys
from typing import Protocol

from ..._doctor import Finding, ok, unsafe, warn
from ._connection import Options, Worker

__all__ = ["diagnose", "filesystem_of"]

# File systems on which SQLite's locks or WAL's shared memory are not reliable.
_NETWORK = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "afs", "ceph", "glusterfs", "lustre"}


def filesystem_of(path: str) -> str | None:
    """The type of the file system that holds ``path`` (Linux), or ``None``."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    target = os.path.realpath(path)
    best, kind = "", None
    for line in lines:
        fields = line.split()
        if "-" not in fields:
            continue
        mount = fields[4].replace("\\040", " ")
        fstype = fields[fields.index("-") + 1]
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, kind = mount, fstype
    return kind


class _Diagnosed(Protocol):
    """What the checks read of the backend (``SqlitePubSub``)."""

    _file: str
    _opts: Options
    _worker: Worker

    async def get_lease_owner(self, key: str) -> str | None: ...


async def diagnose(backend: _Diagnosed) -> list[Finding]:
    file = backend._file
    missing = _not_there(file, create_dirs=backend._opts.create_dirs)
    if missing is not None:
        return missing
    await backend.get_lease_owner("tenure-doctor")  # opens the file: WAL and schema, or fails
    return [
        ok("journal", "WAL (tenure refuses a file it cannot switch to WAL)"),
        _synchronous(backend._opts.synchronous),
        _filesystem(file),
        _permissions(file),
        _wake_ups(backend),
    ]


def _not_there(file: str, *, create_dirs: bool) -> list[Finding] | None:
    """The findings for a file not created yet (nothing is created here), or ``None``."""
    if os.path.exists(file):
        return None
    where = os.path.dirname(file)
    found = [warn("file", f"{file} does not exist yet (tenure creates it on first use)")]
    if not os.path.isdir(where):
        if create_dirs and not os.path.exists(where):
            return [*found, warn("directory", f"{where} does not exist yet (create_dirs=1)")]
        # Without create_dirs the backend refuses it before this is reached.
        return [*found, unsafe("directory", f"{where} does not exist", f"mkdir -p {where}")]
    if not os.access(where, os.W_OK | os.X_OK):
        return [*found, unsafe("directory", f"{where} is not writable by this user", "fix it")]
    return [*found, _filesystem(file)]


def _synchronous(level: str) -> Finding:
    if level == "full":
        return ok("durability", "synchronous=FULL: a committed grant survives a power loss")
    return warn(
        "durability",
        "synchronous=NORMAL: a power loss or OS crash can undo the last grants (a process "
        "crash cannot), and their fencing tokens could be given again",
        "add ?synchronous=full to the URL",
    )


def _filesystem(file: str) -> Finding:
    kind = filesystem_of(os.path.dirname(file))
    if kind is None:
        note = "unknown (no /proc/self/mountinfo)" if sys.platform == "linux" else "not checked"
        return warn("filesystem", note, "keep the file on a local disk")
    base = kind.split(".")[-1] if kind.startswith("fuse.") else kind
    if base in _NETWORK or kind.startswith("fuse.sshfs"):
        return unsafe(
            "filesystem",
            f"{kind}: a network file system; SQLite's locks and WAL's shared memory do not "
            "work across hosts, so two hosts can both be granted a key",
            "use a local disk for one host, or Redis or PostgreSQL across hosts",
        )
    return ok("filesystem", f"{kind} (local)")


def _permissions(file: str) -> Finding:
    mode = os.stat(file).st_mode
    if not os.access(file, os.R_OK | os.W_OK):
        return unsafe("permissions", f"{file} is not writable by this user", "fix its owner")
    if mode & stat.S_IWOTH:
        return warn(
            "permissions",
            f"{file} is writable by every user: any of them can take or revoke leases",
            f"chmod o-w {file}",
        )
    return ok("permissions", f"{stat.filemode(mode)} {file}")


def _wake_ups(backend: _Diagnosed) -> Finding:
    """Whether this process can use the wake-up sockets beside the file (it tries)."""
    backend._worker.listen()
    wake = backend._worker.wake
    if wake.unavailable is None:
        return ok("wake-ups", f"Unix-domain sockets in {wake.dir}")
    return warn(
        "wake-ups",
        f"no wake-up sockets ({wake.unavailable}): releases and events of other processes "
        f"are found by polling every poll_interval ({backend._opts.poll_interval} s)",
        f"make {wake.dir} a writable directory whose socket paths fit in 107 bytes "
        "(a shorter path for the file)",
    )
