"""Hostlist expressions (`gpu[001-128]`, `r[1-2]n[01-02]`, `10.0.0.[11-138]`, `a,b[1-3]`) through ClusterShell.

ClusterShell's ``NodeSet`` (the library behind ``nodeset`` and ``clush``) does the parsing, expanding and folding,
so a hostlist here means what it means to the HPC tools around the cluster:

* expansion is a *set*: sorted (by pattern, then by number; an unpadded ``gpu9`` before a padded ``gpu08``),
  each name once; zero padding follows the lower bound (``[001-128]`` gives ``001`` … ``128``); several bracket
  groups expand as a cartesian product, the leftmost varying slowest (``r[1-2]n[01-02]``);
* folding merges any list into the shortest such set: ``gpu03,gpu07`` → ``gpu[03,07]``, ``r1n01 … r2n02`` →
  ``r[1-2]n[01-02]``, mixed padding kept apart (``gpu[1,01]``).

Only the plain syntax is accepted: ClusterShell's set operators (``!``, ``&``, ``^``), ``@groups``, wildcards
and whitespace are refused, so a value in a spec never means more than it says.

Where the spec pairs two expressions item by item (names with addresses, cabled nodes with switch ports),
``expand(expr, ordered=True)`` also refuses an expression ClusterShell would reorder or shorten (a host named
twice, ``gpu[3,1]``, ``login1,gpu01``, one range mixing padded and unpadded numbers): the list the operator
wrote and the list that gets paired must be the same.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Iterable

from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException

MAX_EXPANSION = 1_000_000


class HostlistError(ValueError):
    """The expression is not a valid hostlist."""


_ALLOWED = re.compile(r"^[A-Za-z0-9._:/+\-\[\],]+$")
_PIECE = re.compile(r"^(\d+)(?:-(\d+))?(?:/(\d+))?$")
_GROUP = re.compile(r"\[([^\[\]]*)\]")


def _nodeset(expr: str) -> NodeSet:
    try:
        return NodeSet(expr, resolver=RESOLVER_NOGROUP)
    except NodeSetException as exc:
        raise HostlistError(f"{expr!r}: {exc}") from None


def _items(expr: str) -> list[str]:
    """The top-level comma-separated items of ``expr`` (commas inside brackets belong to a range)."""
    items: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(expr[start:i])
            start = i + 1
    items.append(expr[start:])
    return items


def _pieces(body: str) -> list[tuple[str, int, int, int]]:
    """``(lower bound as written, lo, hi, step)`` of each piece of one bracket group that reads as a range."""
    out: list[tuple[str, int, int, int]] = []
    for piece in body.split(","):
        m = _PIECE.match(piece)
        if m:
            lo = int(m.group(1))
            out.append((m.group(1), lo, int(m.group(2) or lo), max(1, int(m.group(3) or 1))))
    return out


def _written_count(expr: str) -> int:
    """How many names ``expr`` writes down (repeats counted), from the ranges alone, without expanding."""
    total = 0
    for item in _items(expr):
        count = 1
        for body in _GROUP.findall(item):
            count *= sum(max(0, (hi - lo) // step + 1) for _, lo, hi, step in _pieces(body))
        total += count
    return total


def _sortkey(number: str) -> tuple[int, str]:
    """ClusterShell's order of the numbers of one range: shorter strings first, then by text (mixed padding)."""
    return (len(number), number)


def _last(piece: tuple[str, int, int, int]) -> str:
    """The last number a range piece writes, padded like its lower bound."""
    first, lo, hi, step = piece
    last = hi - (hi - lo) % step
    return str(last).zfill(len(first)) if first.startswith("0") and len(first) > 1 else str(last)


def _check_written_order(expr: str, names: list[str]) -> None:
    """Raise unless ClusterShell's expansion of ``expr`` is exactly the list written (see the module doc)."""
    if _written_count(expr) != len(names):
        raise HostlistError(f"{expr!r} names a host more than once")
    items = _items(expr)
    for item in items:
        for body in _GROUP.findall(item):
            pieces = _pieces(body)
            for prev, cur in itertools.pairwise(pieces):
                if _sortkey(_last(prev)) >= _sortkey(cur[0]):
                    raise HostlistError(f"{expr!r}: [{body}] is not in ascending order; hostlists expand sorted, "
                                        "so write it ascending and pair the other list in the same order")
    if len(items) > 1:
        written = [name for item in items for name in _nodeset(item)]
        if written != names:
            raise HostlistError(f"{expr!r}: hostlists expand sorted ({compress(names)}); write the items in that "
                                "order so that it pairs as written")


def expand(expr: str, *, ordered: bool = False) -> list[str]:
    """The names ``expr`` denotes, in ClusterShell's order.

    ``ordered``: the caller pairs the names with another list, so refuse an expression whose expansion is not
    the list as written.
    """
    if not isinstance(expr, str) or not expr.strip():
        raise HostlistError("empty hostlist")
    return list(_expand(expr.strip(), ordered))


@functools.lru_cache(maxsize=4096)
def _expand(expr: str, ordered: bool) -> tuple[str, ...]:
    """expand(), remembered: a spec repeats its expressions (the same ports on every leaf, one node range per rail),
    and ClusterShell takes about a millisecond for even a short one."""
    if not _ALLOWED.match(expr):
        raise HostlistError(f"{expr!r}: a hostlist holds names, digits, '.', '_', '-' and [ranges] separated by "
                            "commas (no spaces, set operators or @groups)")
    if any(not item for item in _items(expr)):
        raise HostlistError(f"empty item in {expr!r}")
    if _written_count(expr) > MAX_EXPANSION:
        raise HostlistError(f"{expr!r} expands to too many names (more than {MAX_EXPANSION:,})")
    names: list[str] = list(_nodeset(expr))
    if ordered:
        _check_written_order(expr, names)
    return tuple(names)


def compress(names: Iterable[str]) -> str:
    """The folded hostlist of ``names`` (ClusterShell's fold: sorted, each name once)."""
    listed = [n for n in names if n]
    if not listed:
        return ""
    try:
        return str(NodeSet.fromlist(listed, resolver=RESOLVER_NOGROUP))
    except NodeSetException as exc:
        raise HostlistError(f"cannot fold {listed[:3]!r}...: {exc}") from None
