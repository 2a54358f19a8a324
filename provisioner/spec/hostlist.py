"""Slurm-style hostlist expressions: `gpu[001-128]`, `rack[1-2]-n[01-04]`, `10.0.0.[11-138]`, `a,b[1-3]`.

Expansion keeps zero padding from the lower bound (`[001-128]` gives `001` … `128`), expands several bracket
groups as a cartesian product (leftmost group varies slowest, like Slurm), and refuses anything ambiguous
rather than guessing.
"""

from __future__ import annotations

import re

MAX_EXPANSION = 1_000_000


class HostlistError(ValueError):
    """The expression is not a valid hostlist."""


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top(expr: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in expr:
        if ch == "[":
            if depth:
                raise HostlistError(f"nested '[' in {expr!r}")
            depth = 1
        elif ch == "]":
            if not depth:
                raise HostlistError(f"']' without '[' in {expr!r}")
            depth = 0
        if ch == "," and not depth:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise HostlistError(f"'[' without ']' in {expr!r}")
    parts.append("".join(cur))
    return parts


def _expand_group(body: str, expr: str) -> list[str]:
    out: list[str] = []
    if not body:
        raise HostlistError(f"empty brackets in {expr!r}")
    for item in body.split(","):
        m = _RANGE.match(item.strip())
        if not m:
            raise HostlistError(f"bad range {item!r} in {expr!r}: write N or N-M with digits")
        lo_s, hi_s = m.group(1), m.group(2)
        if hi_s is None:
            out.append(lo_s)
            continue
        lo, hi = int(lo_s), int(hi_s)
        if hi < lo:
            raise HostlistError(f"range {item!r} in {expr!r} runs backwards")
        width = len(lo_s) if lo_s.startswith("0") and len(lo_s) > 1 else 0
        if hi - lo + 1 > MAX_EXPANSION:
            raise HostlistError(f"range {item!r} in {expr!r} is too large")
        out.extend(str(i).zfill(width) for i in range(lo, hi + 1))
    return out


def _expand_one(part: str, expr: str) -> list[str]:
    pieces = re.split(r"(\[[^\]]*\])", part)
    results = [""]
    for piece in pieces:
        if piece.startswith("[") and piece.endswith("]"):
            values = _expand_group(piece[1:-1], expr)
            if len(results) * len(values) > MAX_EXPANSION:
                raise HostlistError(f"{expr!r} expands to too many names")
            results = [r + v for r in results for v in values]
        else:
            results = [r + piece for r in results]
    return results


def expand(expr: str) -> list[str]:
    """Expand a hostlist expression into the ordered list of names it denotes."""
    if not isinstance(expr, str) or not expr.strip():
        raise HostlistError("empty hostlist")
    names: list[str] = []
    for part in _split_top(expr.strip()):
        part = part.strip()
        if not part:
            raise HostlistError(f"empty item in {expr!r}")
        names.extend(_expand_one(part, expr))
    return names


def compress(names: list[str]) -> str:
    """The shortest common hostlist for `names` (one bracket group over the trailing number), order kept."""
    out: list[str] = []
    i = 0
    while i < len(names):
        m = re.match(r"^(.*?)(\d+)$", names[i])
        if not m:
            out.append(names[i])
            i += 1
            continue
        prefix, digits = m.group(1), m.group(2)
        width = len(digits)
        start = int(digits)
        j = i + 1
        while j < len(names):
            m2 = re.match(r"^(.*?)(\d+)$", names[j])
            if not m2 or m2.group(1) != prefix or len(m2.group(2)) != width or int(m2.group(2)) != start + (j - i):
                break
            j += 1
        if j - i == 1:
            out.append(names[i])
        else:
            out.append(f"{prefix}[{digits}-{str(start + j - i - 1).zfill(width)}]")
        i = j
    return ",".join(out)
