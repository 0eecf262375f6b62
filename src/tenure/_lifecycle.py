"""``async with`` for everything that has an ``aclose()``."""

from __future__ import annotations

from typing import Self

__all__ = ["AsyncCloseable"]


class AsyncCloseable:
    """Mixin: ``async with obj:`` returns ``obj`` and calls ``await obj.aclose()`` on exit."""

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
