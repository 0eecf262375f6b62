"""A griffe extension: the reST in docstrings shown as Markdown in the API reference.

tenure's docstrings name other objects the Sphinx way (``:class:`~tenure.LeaseLost```)
and introduce examples with ``::``. Markdown has neither: each role becomes inline code
of the name a reader would see in Sphinx (the last part after ``~``), and a ``::``
that ends a paragraph becomes ``:`` (the indented block after it is already code).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):`(~?)([^`]+)`")
_LITERAL = re.compile(r"(?m)(\S)::$|^\s*::$")


def _as_code(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


class RstRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            text = _ROLE.sub(_as_code, obj.docstring.value)
            obj.docstring.value = _LITERAL.sub(
                lambda m: f"{m.group(1)}:" if m.group(1) else "", text
            )
