"""Fixture loading for the parser tests.

Every fixture file starts with up to three header lines, ``# Source: ...`` and
``# Shows: ...``, that no tool prints. They are removed here before parsing; nothing else
in the file is touched (nccl-tests' own ``#`` lines stay, and a capture saved with CRLF line
endings keeps them: the file is read without newline translation).
"""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
_HEADER_PREFIXES = ("# Source:", "# Shows:")


def strip_header(text: str) -> str:
    """Drop the leading ``# Source:``/``# Shows:`` lines (at most three)."""
    lines = text.splitlines(keepends=True)
    i = 0
    while i < min(3, len(lines)) and lines[i].startswith(_HEADER_PREFIXES):
        i += 1
    return "".join(lines[i:])


def load(tool: str, name: str) -> str:
    """Return the sample text of ``tests/fixtures/<tool>/<name>`` without its header."""
    with open(FIXTURES / tool / name, encoding="utf-8", newline="") as f:
        return strip_header(f.read())


def all_fixtures() -> list[tuple[str, str]]:
    """(tool, file name) for every fixture of a `provision parse` tool, in a stable order.

    Other folders under tests/fixtures (dd, findmnt, opensm-log, proc-mounts) belong to the checks that read them.
    """
    from provisioner.parsers import PARSERS

    return sorted((p.parent.name, p.name) for p in FIXTURES.glob("*/*.txt") if p.parent.name in PARSERS)


def grep(text: str, pattern: str, after: int = 0) -> str:
    """What ``grep -E pattern`` (with ``-A after``) prints for ``text``: the way operators paste output.

    Used to turn a real capture into the filtered form (``ibstatus | grep -A1 ...``) without
    inventing any line: every line kept is a line of the capture, with grep's ``--`` between groups.
    """
    import re

    lines = text.splitlines()
    keep: list[int] = []
    for i, line in enumerate(lines):
        if re.search(pattern, line):
            keep.extend(range(i, min(i + after + 1, len(lines))))
    out: list[str] = []
    last = -2
    for i in sorted(set(keep)):
        if out and after and i != last + 1:
            out.append("--")
        out.append(lines[i])
        last = i
    return "\n".join(out) + "\n"
