"""The documentation never lies: every code block in the README and the site runs.

Each Markdown file is read by Sybil, and its blocks run in order in one namespace:

- ```` ```python ```` blocks run in this process; what a block prints is left in the
  namespace as ``printed``, for a following ``<!-- invisible-code-block: python -->``
  to check. A block that changes something process-wide (a global provider, a port)
  runs in a fresh interpreter instead, after ``<!-- own-process: "why" -->``.
- ```` ```bash ````, ```` ```console ```` and ```` ```sh ```` blocks are commands
  (a demo, the test suite, a soak, a CLI session on a deployed server): each one is
  preceded by ``<!-- skip: next "why" -->``, and a shell block without one fails.
  One that is quick and self-contained runs after ``<!-- own-process: "why" -->``,
  in ``bash -euo pipefail`` from the repository's root, the virtualenv first on
  ``PATH``; its output is ``printed``.
- Untagged, ```` ```text ```` and ```` ```mermaid ```` blocks are output, layouts and
  diagrams, not code; any other language fails until this file says how to run it.

Blocks that need a server use the shared Redis and PostgreSQL at their default
addresses (127.0.0.1, ports 6379 and 5432), as a reader would, and fail when one is
missing.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import SkipTest

import pytest
from sybil import Example, Region, Sybil
from sybil.evaluators.skip import Skipper
from sybil.example import NotEvaluated
from sybil.parsers.markdown import ClearNamespaceParser, CodeBlockParser, SkipParser
from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer

ROOT = Path(__file__).resolve().parent.parent
ROOT_PAGES = ("README.md", "BENCHMARKS.md", "SAFETY.md", "TESTING.md")
DOCUMENTS = sorted([*(ROOT / name for name in ROOT_PAGES), *(ROOT / "docs").rglob("*.md")])
SHELLS = ("bash", "console", "sh")
NOT_CODE = ("", "text", "mermaid")
_OWN_PROCESS = "__own_process__"


def _in_own_process(example: Example, argv: list[str]) -> None:
    bindir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(
        [*argv, str(example.parsed)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"{example.path}:{example.line}:\n{result.stderr}"
    example.namespace["printed"] = result.stdout


def _run_python(example: Example) -> None:
    namespace = example.namespace
    if namespace.pop(_OWN_PROCESS, None) is not None:
        _in_own_process(example, [sys.executable, "-c"])
        return
    code = compile(
        "\n" * (example.line + example.parsed.line_offset) + str(example.parsed),
        example.path,
        "exec",
        dont_inherit=True,
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, namespace)
    namespace.pop("__builtins__", None)
    namespace["printed"] = out.getvalue()


def _shell(example: Example) -> None:
    if example.namespace.pop(_OWN_PROCESS, None) is not None:
        _in_own_process(example, ["bash", "-euo", "pipefail", "-c"])
        return
    raise AssertionError(
        f"{example.path}:{example.line}: a shell block neither runs nor says why: "
        'put <!-- skip: next "why" --> before it, or make it a python block'
    )


def _own_process(example: Example) -> None:
    reason = example.parsed
    if not reason:
        raise AssertionError(f"{example.path}:{example.line}: own-process must say why")
    example.namespace[_OWN_PROCESS] = reason


class _OwnProcessParser:
    """``<!-- own-process: "why" -->``: the next block runs in a process of its own."""

    def __init__(self) -> None:
        self.lexer = DirectiveInHTMLCommentLexer(directive="own-process")

    def __call__(self, document: Any) -> Any:
        for lexed in self.lexer(document):
            yield Region(lexed.start, lexed.end, lexed.lexemes["arguments"], _own_process)


SYBIL = Sybil(
    parsers=[
        CodeBlockParser("python", _run_python),
        *(CodeBlockParser(shell, _shell) for shell in SHELLS),
        SkipParser(),
        ClearNamespaceParser(),
        _OwnProcessParser(),
    ],
)


def _fence_languages(text: str) -> list[tuple[int, str]]:
    """The info string of every fenced block, with its line."""
    found: list[tuple[int, str]] = []
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        match = re.match(r"^\s*(?:[-*+]\s+|>\s*)?(`{3,}|~{3,})(.*)$", line)
        if not match:
            continue
        if fence is None:
            fence = match.group(1)
            found.append((number, match.group(2).strip()))
        elif match.group(1).startswith(fence) and not match.group(2).strip():
            fence = None
    return found


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", DOCUMENTS, ids=_name)
def test_every_block_runs_or_says_why(path: Path) -> None:
    unknown = [
        (line, language)
        for line, language in _fence_languages(path.read_text(encoding="utf-8"))
        if language not in NOT_CODE + SHELLS + ("python",)
    ]
    assert not unknown, f"{_name(path)}: blocks in a language this test cannot run: {unknown}"
    document = SYBIL.parse(path)
    skipped = []
    for example in document:
        if isinstance(example.region.evaluator, Skipper):
            action, reason = example.parsed
            assert reason or action == "end", (
                f"{_name(path)}:{example.line}: a skip must say why: "
                '<!-- skip: next "the reason" -->'
            )
        try:
            example.evaluate()
        except SkipTest as skip:
            skipped.append((example.line, str(skip)))
        except NotEvaluated:
            pass
    for line, reason in skipped:
        print(f"{_name(path)}:{line}: skipped: {reason}")


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Set-up: two commands", 1)[1].split("```", 2)[1]
    commands = [line.split("#")[0].strip() for line in block.splitlines()[1:] if line.strip()]
    assert commands == ["bash scripts/demo", "bash scripts/test"]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "\nbash scripts/test" in ci
    assert (ROOT / "scripts" / "demo").exists()


def test_ci_builds_the_site_strictly() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "mkdocs build --strict" in ci
