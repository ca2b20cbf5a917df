"""Fenced code blocks of the README and docs/, as data: what to run, what it should print.

The rules (also in docs/api.md, "Examples in these docs are tested"):

- a block in ``sh``, ``python``, ``js`` or ``html`` runs, in document order, against a
  real gateway (tests/newcomer/test_doc_blocks.py says how each kind runs);
- a ``text`` block right after a block that ran is that block's expected output; ``...``
  stands for anything (ids, times, receipts);
- a block that cannot run says so, and why, in a comment on the line before it:
  ``<!-- not-run: runs the gateway itself; tests/gateway/test_server.py runs it -->``;
- ``text`` blocks elsewhere are pictures (diagrams, synopses, output) and ``json`` blocks are
  shapes; a block with no language is an error (say what it is).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

RUNNABLE = frozenset({"sh", "python", "js", "html"})
SHOWN = frozenset({"text", "json"})
_FENCE = re.compile(r"^```(\S*)\s*$")
_NOT_RUN = re.compile(r"^<!--\s*not-run:\s*(.+?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    source: str
    not_run: str | None  # the reason, when marked
    expected: str | None  # the text block right after, if any

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.lang in RUNNABLE and self.not_run is None


class DocError(ValueError):
    """A block the rules do not allow (no language, unknown language, an unclosed fence)."""


def parse(path: Path) -> list[Block]:
    """Every fenced block of a Markdown file, with its marker and expected output."""
    lines = path.read_text().splitlines()
    raw: list[tuple[int, int, str, str, str | None]] = []  # opening line, closing index, ...
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        start, lang = i, fence.group(1)
        end = i + 1
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        if end == len(lines):
            raise DocError(f"{path.name}:{start + 1}: unclosed code fence")
        previous = lines[start - 1] if start > 0 else ""
        marker = _NOT_RUN.match(previous.strip())
        source = "\n".join(lines[start + 1 : end])
        raw.append((start + 1, end, lang, source, marker.group(1) if marker else None))
        i = end + 1
    blocks: list[Block] = []
    for n, (line, end, lang, source, not_run) in enumerate(raw):
        if not lang:
            raise DocError(
                f"{path.name}:{line}: a code block needs a language (sh, python, js, html, text, json)"
            )
        if lang not in RUNNABLE | SHOWN:
            raise DocError(f"{path.name}:{line}: unknown block language {lang!r}")
        expected = None
        if lang in RUNNABLE and n + 1 < len(raw):
            next_line, _, next_lang, next_source, _ = raw[n + 1]
            between = lines[end + 1 : next_line - 1]
            if next_lang == "text" and all(not b.strip() for b in between):
                expected = next_source
        blocks.append(Block(path, line, lang, source, not_run, expected))
    return blocks


def matches(expected: str, output: str) -> bool:
    """Whether ``output`` is ``expected`` with each ``...`` standing for any text."""
    pattern = ".*?".join(re.escape(part) for part in expected.strip().split("..."))
    return re.fullmatch(pattern, output.strip(), re.S) is not None
