"""Text that others wrote (nodes, switches, tools, a spec), made safe to print on a terminal or in a comment.

A node's answer can carry terminal control sequences: OSC 52 (``ESC ] 52 ; c ; <base64> BEL``) writes the
operator's clipboard, CSI sequences move the cursor or recolour what is printed after them, C1 controls (U+0080
to U+009F) act as ESC on some terminals, bidi overrides reorder what the operator reads. None of them may reach
a terminal, a log line or a YAML comment: :func:`printable` is the one place that makes such text safe, and
every place that prints node-reported text goes through it.
"""

from __future__ import annotations

ELLIPSIS = "…"


def escaped(text: object) -> str:
    """``text`` with every character that is not printable (a newline, a control or line-separator character)
    written as its Python escape, nothing else changed: for names and paths, shown exactly as they are and always
    on one line, which no reader of a generated file or a terminal can take for more than text."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in str(text))


def printable(text: object, limit: int | None = None) -> str:
    """``text`` as one line that is safe to print: every run of whitespace (newlines, CR included) becomes one
    space, every other character that is not printable (ESC, BEL, C0/C1 controls, bidi and other format
    characters, unassigned code points) is shown escaped (``\\x1b``, ``\\u202e``), never emitted. Longer than
    ``limit`` characters, it is cut and ends in an ellipsis (the escapes count)."""
    one = escaped(" ".join(str(text).split()))
    if limit is not None and len(one) > limit:
        return one[:max(limit - 1, 0)] + ELLIPSIS
    return one


def printable_json(text: str) -> str:
    """JSON text (``json.dumps(..., ensure_ascii=False)``) with every character that is not printable written as
    its ``\\uXXXX`` escape: the same JSON value, but no C1 control or bidi override reaches a terminal that shows
    it (json.dumps escapes only C0). Outside strings JSON holds only printable characters and newlines."""
    out: list[str] = []
    for ch in text:
        if ch.isprintable() or ch == "\n":
            out.append(ch)
        elif ord(ch) > 0xFFFF:  # a surrogate pair, as JSON spells it
            code = ord(ch) - 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
        else:
            out.append(f"\\u{ord(ch):04x}")
    return "".join(out)
