"""How the shared fixtures reach each backend: one ``TARGET`` per contract-test file.

``tests/contract/test_<name>.py`` defines ``TARGET = BackendTarget(...)``; the
fixtures parametrized over backends (``backend_url`` and the tests built on
``isolated_url``) find every target here, so adding a backend touches no
shared test file.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BackendTarget", "targets"]


@dataclass(frozen=True)
class BackendTarget:
    #: The name tests are parametrized with (``memory``, ``sqlite``, ...).
    name: str
    #: A URL that shares no state with any other test: ``isolated_url(unique, tmp_path)``.
    isolated_url: Callable[[str, Path], str]
    #: Drops what ``isolated_url`` created outside ``tmp_path`` (a schema, keys).
    cleanup: Callable[[str], None] | None = None


def targets() -> dict[str, BackendTarget]:
    """Every ``TARGET`` of ``tests/contract``, by name, in a stable order."""
    import tests.contract as package

    found: dict[str, BackendTarget] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if not info.name.startswith("test_"):
            continue
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        target = getattr(module, "TARGET", None)
        if isinstance(target, BackendTarget):
            found[target.name] = target
    return found
