"""Pages of the site whose text lives outside ``docs/``.

The README and the evidence files stay at the repository's root, where readers of
the repository look for them; the site shows the same text (the README as its home
page), with their links to other root files and into ``docs/`` made relative to the
site.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

# Root file -> its page in the site.
ROOT_PAGES = {
    "BENCHMARKS.md": "benchmarks.md",
    "SAFETY.md": "safety.md",
    "TESTING.md": "testing.md",
    "README.md": "index.md",
}

# A page another branch adds (the runtime's rooms); until it is there, the nav points
# at this stand-in so that the strict build holds.
STAND_INS = {"runtime.md": "# The runtime's rooms\n\nThis page is being written.\n"}

_LINK = re.compile(r"\]\((?!https?://|#)([^)#\s]+)")


def _relink(text: str) -> str:
    def target(match: re.Match[str]) -> str:
        path = match.group(1)
        if path in ROOT_PAGES:
            return f"]({ROOT_PAGES[path]}"
        return "](" + path.removeprefix("docs/")

    return _LINK.sub(target, text)


def on_files(files: Files, config: Any) -> Files:
    root = Path(config.config_file_path).parent
    for source, uri in ROOT_PAGES.items():
        text = (root / source).read_text(encoding="utf-8")
        files.append(File.generated(config, uri, content=_relink(text)))
    for uri, text in STAND_INS.items():
        if files.get_file_from_path(uri) is None:
            files.append(File.generated(config, uri, content=text))
    return files
