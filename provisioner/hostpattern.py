"""`--limit` as ops write it: Ansible host patterns over the spec's hosts and rendered groups, plus hostlists.

    compute,!gpu03            the group compute without gpu03
    rail_0:&leaf_rail0        hosts in both groups (':' separates when no ',' is given, as in Ansible)
    gpu0*  ~gpu0[1-3]         shell glob or regex over host and group names
    compute[0:3]  compute[2]  a slice of a group (Ansible's subscript, end inclusive)
    gpu[01-04,07]             a hostlist, the syntax `provision` prints in its retry commands

Terms are applied as Ansible applies them (ansible.inventory.manager.order_patterns): every plain term is
added, then each `&` term intersects, then each `!` term removes; with only `&`/`!` terms the start is all
hosts. Unlike Ansible, which warns and carries on, a term that matches nothing is an error (a typo in
`!gpu013` must not converge gpu013), and so is a pattern that leaves no host: an empty `--limit` once
converged every host.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence

from provisioner.errors import UsageError
from provisioner.spec.hostlist import HostlistError, compress, expand

_SUBSCRIPT = re.compile(r"^(?P<base>.+?)\[(?:(?P<idx>-?\d+)|(?P<start>-?\d*):(?P<end>-?\d*))\]$")
_GLOB = re.compile(r"[*?]")


def split_pattern(pattern: str) -> list[str]:
    """The terms of a pattern: ',' separates (outside brackets); without a ',', ':' does (outside brackets)."""
    sep = "," if _outside_brackets(pattern, ",") else ":"
    terms: list[str] = []
    depth, cur = 0, ""
    for ch in pattern:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        if ch == sep and depth == 0:
            terms.append(cur)
            cur = ""
        else:
            cur += ch
    terms.append(cur)
    return [t.strip() for t in terms if t.strip()]


def _outside_brackets(text: str, ch: str) -> bool:
    depth = 0
    for c in text:
        depth += (c == "[") - (c == "]")
        if c == ch and depth <= 0:
            return True
    return False


def _one(term: str, hosts: Sequence[str], groups: Mapping[str, Sequence[str]], what: str) -> set[str]:
    """The hosts one term (without its ! or &) names."""
    known = set(hosts)
    if term in ("all", "*"):
        return known
    if term.startswith("~"):
        try:
            rx = re.compile(term[1:])
        except re.error as exc:
            raise UsageError(f"{what}: '{term}' is not a regular expression ({exc})") from None
        out = {h for h in hosts if rx.match(h)}
        for g, members in groups.items():
            if rx.match(g):
                out.update(members)
        return out
    m = _SUBSCRIPT.match(term)
    if m and m["base"] in groups:
        members = list(groups[m["base"]])
        try:
            if m["idx"] is not None:
                return {members[int(m["idx"])]}
        except IndexError:
            raise UsageError(f"{what}: '{term}': group {m['base']} has {len(members)} host(s)") from None
        start = int(m["start"]) if m["start"] else 0
        end = int(m["end"]) if m["end"] else len(members) - 1
        return set(members[start:end + 1 if end != -1 else None])
    if term in groups:
        return set(groups[term])
    if term in known:
        return {term}
    if _GLOB.search(term):
        out = {h for h in hosts if fnmatch.fnmatchcase(h, term)}
        for g, members in groups.items():
            if fnmatch.fnmatchcase(g, term):
                out.update(members)
        return out
    if "[" in term:
        try:
            names = expand(term)
        except HostlistError as exc:
            raise UsageError(f"{what}: {exc}") from None
        unknown = [n for n in names if n not in known]
        if unknown:
            raise UsageError(f"{what} names host(s) not in the spec: {compress(unknown)}")
        return set(names)
    return set()


def select_hosts(pattern: str, hosts: Sequence[str], groups: Mapping[str, Sequence[str]] | None = None, *,
                 what: str = "--limit") -> list[str]:
    """The hosts `pattern` selects, in spec order; UsageError when it is empty, a term matches nothing, or
    nothing is left."""
    groups = groups or {}
    terms = split_pattern(pattern)
    if not terms:
        raise UsageError(f"{what} is empty", hint="name hosts or groups, e.g. gpu[01-04] or compute,!gpu03")
    plain = [t for t in terms if t[0] not in "!&"] or ["all"]
    meets = [t[1:] for t in terms if t[0] == "&"]
    drops = [t[1:] for t in terms if t[0] == "!"]
    chosen: set[str] = set()
    for term in [*plain, *meets, *drops]:
        if not term:
            raise UsageError(f"{what}: '!' or '&' without a name in '{pattern}'")
    matched: dict[str, set[str]] = {}
    for term in dict.fromkeys([*plain, *meets, *drops]):
        found = _one(term, hosts, groups, what)
        if not found:
            raise UsageError(f"{what}: '{term}' matches no host or group of the spec",
                             hint="hosts and groups are those `provision render` writes (hosts.yml)")
        matched[term] = found
    for term in plain:
        chosen |= matched[term]
    for term in meets:
        chosen &= matched[term]
    for term in drops:
        chosen -= matched[term]
    if not chosen:
        raise UsageError(f"{what} '{pattern}' leaves no host to work on")
    return [h for h in hosts if h in chosen]
