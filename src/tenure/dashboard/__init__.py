"""``tenure dashboard``: a live web view of leases, threads and health, with audited actions.

A user of the operations API only (``scan_leases``, ``get_lease``,
``revoke_lease``, the runtime's thread statuses, the backends' doctor
checks). Needs the ``dashboard`` extra: ``pip install 'tenure[dashboard]'``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from ._app import DashboardSettings

__all__ = ["DashboardSettings", "create_app"]


def create_app(settings: DashboardSettings) -> Starlette:
    """The dashboard's ASGI app for ``settings`` (see :class:`DashboardSettings`)."""
    from ._app import create_app as create

    return create(settings)


def __getattr__(name: str) -> Any:
    # Starlette and Jinja2 are imported only when the dashboard is used, so the
    # command line can offer `tenure dashboard` without the extra installed.
    if name == "DashboardSettings":
        from ._app import DashboardSettings

        return DashboardSettings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
