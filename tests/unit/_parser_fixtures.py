"""Fixture loading for the parser tests.

Every fixture file starts with up to three header lines, ``# Source: ...`` and
``# Shows: ...``, that no tool prints. They are removed here before parsing; nothing else
in the file is touched (nccl-tests' own ``#`` lines stay).
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
    return strip_header((FIXTURES / tool / name).read_text(encoding="utf-8"))


def all_fixtures() -> list[tuple[str, str]]:
    """(tool, file name) for every fixture of a `provision parse` tool, in a stable order.

    Other folders under tests/fixtures (dd, findmnt, opensm-log, proc-mounts) belong to the checks that read them.
    """
    from provisioner.parsers import PARSERS

    return sorted((p.parent.name, p.name) for p in FIXTURES.glob("*/*.txt") if p.parent.name in PARSERS)
