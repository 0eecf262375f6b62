"""The Lua scripts of ``lua/``: loaded once, run with ``EVALSHA`` (``EVAL`` after ``NOSCRIPT``)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources

__all__ = ["Script", "load_script"]


@dataclass(frozen=True)
class Script:
    """A Lua script shipped in ``lua/``, run with ``EVALSHA`` (``EVAL`` after ``NOSCRIPT``)."""

    name: str
    body: bytes
    sha: str


def load_script(name: str) -> Script:
    body = resources.files("tenure.backends.redis").joinpath("lua", f"{name}.lua").read_bytes()
    return Script(name, body, hashlib.sha1(body).hexdigest())
