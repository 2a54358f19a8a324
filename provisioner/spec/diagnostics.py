"""One problem found in a spec, printed as `file:line:col: RULE-ID: message (how to fix)`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning"]


def _one_line(text: str) -> str:
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in " ".join(text.split()))


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
        """One line, always: control characters from the input are shown escaped, never printed."""
        tail = f" ({_one_line(self.hint)})" if self.hint else ""
        level = "" if self.severity == "error" else "warning: "
        return f"{self.file}:{self.line}:{self.col}: {self.rule}: {level}{_one_line(self.message)}{tail}"

    def to_json(self) -> dict[str, object]:
        return {
            "file": self.file, "line": self.line, "col": self.col, "rule": self.rule,
            "severity": self.severity, "message": self.message, "hint": self.hint,
        }
