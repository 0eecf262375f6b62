"""``async with`` for everything that has an ``aclose()``, ``with`` for a ``close()``."""

from __future__ import annotations

from typing import Self

__all__ = ["AsyncCloseable", "Closeable"]


class AsyncCloseable:
    """Mixin: ``async with obj:`` returns ``obj`` and calls ``await obj.aclose()`` on exit."""

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class Closeable:
    """Mixin: ``with obj:`` returns ``obj`` and calls ``obj.close()`` on exit."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
