"""Parser for ``ibqueryerrors`` (infiniband-diags): the ports whose PMA error counters are above a threshold.

The format, from rdma-core's ``infiniband-diags/ibqueryerrors.c`` (``print_results``/``print_summary``) and the
captures under ``tests/fixtures/ibqueryerrors/``::

    Errors for 0x2c903006e29b0 "MF0;ys23ib4:SX6036/U1"        <- a switch: its GUID and description
       GUID 0x2c903006e29b0 port ALL: [LinkDownedCounter == 48] [PortXmitWait == 4294967295]
       GUID 0x2c903006e29b0 port 5: [SymbolErrorCounter == 65535] [LinkErrorRecoveryCounter == 8]
    Errors for "rd240 mlx4_0"                                  <- a CA: its description only
       GUID 0xe41d2d0300e0bae1 port 1: [PortXmitWait == 4294967295]

    ## Summary: 4 nodes checked, 4 bad nodes found
    ##          43 ports checked, 14 ports have errors beyond threshold

A node or port without any counter above its threshold (0 unless a threshold file says otherwise) is not
printed at all. Counters are named as libibmad's ``fields.c`` names them (``SymbolErrorCounter``, ...); with the
extended counters a value carries a human-readable copy (``[PortXmitWait == 1234 (1.234K)]``), which is dropped.
``port ALL`` (the switch's sum over its ports, when its PMA supports AllPortSelect) becomes ``port: None``.
The tool exits 1 when it printed any error, so the exit status says nothing about whether it ran.

Port lines without their ``Errors for`` line (``ibqueryerrors | grep SymbolError``) go to a node with no name,
GUID or type. Lines from the libraries on stderr (``src/query_smp.c:195; umad (DR path ...) bad status 110;
Connection timed out`` while discovering, ``ibwarn: ... query failed on ...``) are ``errors`` (stderr alone parses,
``complete`` false): the summary is still printed after them, but the nodes behind those paths were never asked,
so ``complete`` says only that the sweep ended; whoever judges the counters reads ``errors`` and
``pma_query_failures`` too.
"""

from __future__ import annotations

import re
from typing import Any

from provisioner.errors import ParseError
from provisioner.parsers._common import diag_error_line, norm_guid, require_text

_NODE_RE = re.compile(r'^Errors for (?:(?P<guid>0x[0-9a-fA-F]+) )?"(?P<name>.*)"\s*$')
_PORT_RE = re.compile(r"^\s*GUID (?P<guid>0x[0-9a-fA-F]+) port (?P<port>ALL|\d+):(?P<rest>.*)$")
_COUNTER_RE = re.compile(r"\[(?P<name>[A-Za-z0-9]+) == (?P<value>\d+)(?: \([^)]*\))?\]")
_SUMMARY_NODES_RE = re.compile(r"^## Summary: (\d+) nodes checked, (\d+) bad nodes found")
_SUMMARY_PORTS_RE = re.compile(r"^##\s+(\d+) ports checked, (\d+) ports have errors beyond threshold")
_PMA_FAILURES_RE = re.compile(r"^##\s+(\d+) PMA query failures")


def parse_ibqueryerrors(text: str) -> dict[str, Any]:
    """Parse ``ibqueryerrors`` into nodes (switches and CAs) with their ports' counters, and the summary."""
    require_text("ibqueryerrors", text)
    nodes: list[dict[str, Any]] = []
    node: dict[str, Any] | None = None
    summary: dict[str, int] = {}
    errors: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if diag_error_line(stripped, "ibqueryerrors") or stripped in ("discover failed",):
            errors.append(stripped)
            continue
        n = _NODE_RE.match(stripped)
        if n:
            guid = n.group("guid")
            node = {"name": n.group("name"), "guid": norm_guid(guid) if guid else None,
                    "type": "switch" if guid else "ca", "ports": []}
            nodes.append(node)
            continue
        p = _PORT_RE.match(line)
        if p:
            guid = norm_guid(p.group("guid"))
            if node is None or (node["name"] is None and node["ports"] and node["ports"][-1]["guid"] != guid):
                # pasted through grep: port lines without their "Errors for" line, one unnamed node per GUID run
                node = {"name": None, "guid": None, "type": None, "ports": []}
                nodes.append(node)
            port = p.group("port")
            node["ports"].append({
                "port": None if port == "ALL" else int(port),
                "guid": guid,
                "counters": {m.group("name"): int(m.group("value")) for m in _COUNTER_RE.finditer(p.group("rest"))},
            })
            continue
        for pattern, keys in ((_SUMMARY_NODES_RE, ("nodes_checked", "bad_nodes")),
                              (_SUMMARY_PORTS_RE, ("ports_checked", "bad_ports")),
                              (_PMA_FAILURES_RE, ("pma_query_failures",))):
            m = pattern.match(stripped)
            if m:
                summary.update({k: int(v) for k, v in zip(keys, m.groups(), strict=True)})
    if "nodes_checked" not in summary and not nodes and not _only_its_own_errors(text, errors):
        raise ParseError('ibqueryerrors: no "Errors for ..." block and no "## Summary:" line found')
    return {
        "tool": "ibqueryerrors",
        "nodes": nodes,
        "summary": {k: summary.get(k) for k in ("nodes_checked", "bad_nodes", "ports_checked", "bad_ports")}
        | {"pma_query_failures": summary.get("pma_query_failures", 0)},
        "complete": "nodes_checked" in summary,
        "errors": errors,
        "warnings": [],
    }


def _only_its_own_errors(text: str, errors: list[str]) -> bool:
    """Stderr alone: every line an infiniband-diags error line this tool may print (``diag_error_line`` already
    refuses another tool's ``sminfo: iberror:``), none an ``ibpanic:`` (ibstat's main uses it, ibqueryerrors
    never). Error lines of the libraries are shared by every tool, so this is the most such input can say."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return bool(errors) and len(errors) == len(lines) and not any(e.startswith("ibpanic:") for e in errors)
