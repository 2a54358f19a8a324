"""One problem found in a spec, printed as `file:line:col: RULE-ID: message (how to fix)`.

One cause is one line: :func:`fold` merges the diagnostics that one spec element (a hostlist range) produced
for each of its hosts into one diagnostic naming the folded hostlist (``gpu[01-08] has no device mlx5_2``).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Literal

from provisioner.safetext import escaped, printable
from provisioner.spec import hostlist

Severity = Literal["error", "warning"]


@dataclass(frozen=True, order=True)
class Diagnostic:
    file: str
    line: int
    col: int
    rule: str
    severity: Severity
    message: str
    hint: str = ""

    def format(self) -> str:
        """One line, always: control characters from the input (and the file's name) are shown escaped."""
        tail = f" ({printable(self.hint)})" if self.hint else ""
        level = "" if self.severity == "error" else "warning: "
        return f"{escaped(self.file)}:{self.line}:{self.col}: {self.rule}: {level}{printable(self.message)}{tail}"

    def to_json(self) -> dict[str, object]:
        return {
            "file": self.file, "line": self.line, "col": self.col, "rule": self.rule,
            "severity": self.severity, "message": self.message, "hint": self.hint,
        }


_TOKEN = re.compile(r"([A-Za-z0-9][A-Za-z0-9-]*)")
_HOST = re.compile(r"^([a-z][a-z0-9-]*?)(\d+)$")


def _host_key(name: str) -> tuple[str, int, str]:
    m = _HOST.match(name)
    return (m.group(1), int(m.group(2)), name) if m else (name, -1, name)


def fold(diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
    """Merge diagnostics of one place and rule whose messages differ only in one host name.

    They come from one spec element expanded over a hostlist (a cabling line over ``gpu[01-08]``), so they are
    one cause: the merged message names the hosts as a folded hostlist. Only a differing word that looks like
    a host name (letters then digits: ``gpu07``, ``x8``) is folded; numbers, devices and anything else that
    differs keep their own lines.
    """
    groups: dict[tuple[object, ...], list[tuple[Diagnostic, list[str]]]] = defaultdict(list)
    for d in diagnostics:
        parts = _TOKEN.split(d.message)
        groups[(d.file, d.line, d.col, d.rule, d.severity, d.hint, len(parts))].append((d, parts))
    out: list[Diagnostic] = []
    for members in groups.values():
        out.extend(_fold_group(members))
    return out


def _fold_group(members: list[tuple[Diagnostic, list[str]]]) -> list[Diagnostic]:
    if len(members) < 2:
        return [d for d, _ in members]
    first = members[0][1]
    differ = [i for i in range(len(first)) if any(parts[i] != first[i] for _, parts in members)]
    if len(differ) != 1:
        return [d for d, _ in members]  # more than one word differs: different causes
    at = differ[0]
    names = sorted({parts[at] for _, parts in members}, key=_host_key)
    if not all(_HOST.match(n) for n in names):
        return [d for d, _ in members]
    merged = [*first]
    merged[at] = hostlist.compress(names)
    return [replace(members[0][0], message="".join(merged))]
