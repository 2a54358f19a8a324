"""Simulated ``ibqueryerrors``: the PMA error counters of every port the fabric discovery reaches (stdlib only).

Format and behaviour from rdma-core's ``infiniband-diags/ibqueryerrors.c`` (``print_results``, ``print_node``,
``print_summary``, ``main``) and the captures under ``tests/fixtures/ibqueryerrors/``:

* nodes in the order the discovery library lists them (the reverse of discovery, as ``ibnetdiscover`` prints);
  a node is printed only when one of its counters is above its threshold (0: no threshold file);
* a switch is headed ``Errors for 0x<guid> "<description>"`` and, its PMA supporting AllPortSelect (Mellanox
  switches do), first gets a ``port ALL`` line with the sum over its ports; a CA is headed by its description;
* each port line lists ``[<libibmad field name> == <value>]`` in libibmad's field order (``fields.c``), the
  error counters and then ``PortXmitWait``;
* the summary: nodes checked, bad nodes, ports checked (a switch without errors counts its ports, one with
  errors its ports 0..N), ports with errors; ``## Thresholds: `` and ``## Suppressed:``; exit status 1 when a
  port had errors;
* ``--switch``/``--ca`` limit the node kinds, ``-k`` clears the error counters after reading them, ``-s a,b``
  suppresses fields.

Counters: an HCA port's live in its node.json (``counters``, sysfs names); a switch port's in fabric.json
(``switches[].counters["<port>"]``, the same names), raised by the switch fault kinds (``provisioner.lab.faults``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

try:
    from provisioner.lab.simtools import fabsim_common as common
    from provisioner.lab.simtools import fabsim_sm, labstate
except ImportError:  # inside a node
    import fabsim_common as common  # type: ignore[import-not-found,no-redef]
    import fabsim_sm  # type: ignore[import-not-found,no-redef]
    import labstate  # type: ignore[import-not-found,no-redef]

MAD_FIELDS: tuple[tuple[str, str], ...] = (
    ("symbol_error", "SymbolErrorCounter"),
    ("link_error_recovery", "LinkErrorRecoveryCounter"),
    ("link_downed", "LinkDownedCounter"),
    ("port_rcv_errors", "PortRcvErrors"),
    ("port_rcv_remote_physical_errors", "PortRcvRemotePhysicalErrors"),
    ("port_rcv_switch_relay_errors", "PortRcvSwitchRelayErrors"),
    ("port_xmit_discards", "PortXmitDiscards"),
    ("port_xmit_constraint_errors", "PortXmitConstraintErrors"),
    ("port_rcv_constraint_errors", "PortRcvConstraintErrors"),
    ("local_link_integrity_errors", "LocalLinkIntegrityErrors"),
    ("excessive_buffer_overrun_errors", "ExcessiveBufferOverrunErrors"),
    ("VL15_dropped", "VL15Dropped"),
    ("port_xmit_wait", "PortXmitWait"),
)
"""sysfs counter name -> libibmad PortCounters field name, in the order ibqueryerrors prints them."""


# ---------------------------------------------------------------- switch counters in fabric.json (pure)


def switch_counters(switch: Mapping[str, Any], port: int) -> dict[str, int]:
    """One switch port's counters: fabric.json's over zeros."""
    stored = (switch.get("counters") or {}).get(str(port)) or {}
    return {name: int(stored.get(name, 0)) for name in labstate.PORT_COUNTERS}


def bump_switch_counters(fabric: dict[str, Any], switch: str, port: int, deltas: Mapping[str, int]) -> None:
    """Raise one switch port's counters in place, saturating at each counter's width like a PMA."""
    for sw in fabric.get("switches", []):
        if str(sw.get("name")) == switch:
            counts = switch_counters(sw, port)
            for name, delta in deltas.items():
                counts[name] = min(counts[name] + int(delta), 2 ** labstate.PORT_COUNTERS[name] - 1)
            sw.setdefault("counters", {})[str(port)] = {k: v for k, v in counts.items() if v}
            return
    raise KeyError(f"no switch {switch!r} in fabric.json")


# ---------------------------------------------------------------- output (pure)


def _fields(counts: Mapping[str, int], suppressed: set[str]) -> str:
    return "".join(f" [{mad} == {int(counts.get(name, 0))}]" for name, mad in MAD_FIELDS
                   if counts.get(name, 0) > 0 and mad not in suppressed)


def report(nodes: Sequence[tuple[str, dict[str, Any]]], suppressed: set[str]) -> tuple[str, int]:
    """The text and exit status for nodes given as ("S", switch info) or ("H", CA info) in print order.

    A switch info has ``guid``, ``desc``, ``ports`` (count) and ``counters`` {port: counts}; a CA info has
    ``desc`` and ``counters`` {port: (port guid, counts)}.
    """
    lines: list[str] = []
    checked = bad_nodes = ports_checked = bad_ports = 0
    for kind, info in nodes:
        checked += 1
        header = False
        if kind == "S":
            per_port = {p: c for p, c in info["counters"].items() if _fields(c, suppressed)}
            total = {name: min(sum(c.get(name, 0) for c in info["counters"].values()),
                               2 ** labstate.PORT_COUNTERS[name] - 1) for name, _ in MAD_FIELDS}
            if not _fields(total, suppressed):
                ports_checked += int(info["ports"])
                continue
            lines.append(f'Errors for 0x{info["guid"]:x} "{info["desc"]}"')
            lines.append(f"   GUID 0x{info['guid']:x} port ALL:{_fields(total, suppressed)}")
            bad_nodes += 1
            ports_checked += int(info["ports"]) + 1
            for port in sorted(per_port):
                lines.append(f"   GUID 0x{info['guid']:x} port {port}:{_fields(per_port[port], suppressed)}")
                bad_ports += 1
            continue
        for port, (guid, counts) in sorted(info["counters"].items()):
            ports_checked += 1
            text = _fields(counts, suppressed)
            if not text:
                continue
            if not header:
                lines.append(f'Errors for "{info["desc"]}"')
                header, bad_nodes = True, bad_nodes + 1
            lines.append(f"   GUID 0x{common.guid_int(guid):x} port {port}:{text}")
            bad_ports += 1
    lines += ["", f"## Summary: {checked} nodes checked, {bad_nodes} bad nodes found",
              f"##          {ports_checked} ports checked, {bad_ports} ports have errors beyond threshold",
              "## Thresholds: ", "## Suppressed:" + "".join(f" {s}" for s in sorted(suppressed))]
    return "\n".join(lines) + "\n", 1 if bad_ports else 0


# ---------------------------------------------------------------- the tool (I/O)


def _options(argv: Sequence[str]) -> dict[str, Any] | str:
    opts: dict[str, Any] = {"switch": False, "ca": False, "clear": False, "suppressed": set()}
    items = list(argv)
    while items:
        arg = items.pop(0)
        if arg == "--switch":
            opts["switch"] = True
        elif arg == "--ca":
            opts["ca"] = True
        elif arg in ("-k", "--clear-errors"):
            opts["clear"] = True
        elif arg in ("-s", "--suppress"):
            opts["suppressed"] = set((items.pop(0) if items else "").split(","))
        elif arg.startswith("--suppress="):
            opts["suppressed"] = set(arg.split("=", 1)[1].split(","))
        else:
            return arg
    return opts


def main(argv: Sequence[str]) -> int:
    opts = _options(argv[1:])
    if isinstance(opts, str):
        print(f"ibqueryerrors: the lab simulates only --switch, --ca, -k and -s (not {opts!r})", file=sys.stderr)
        return 1
    root, host = common.lab_root(), common.this_host()
    topo = fabsim_sm.build_topology(root)
    local = fabsim_sm._local_ib_port(topo, host)
    if local is None:
        print("discover failed", file=sys.stderr)
        return 255
    masters = [s for s in fabsim_sm._fresh_sms(root) if s.get("state") == "master"]
    if local[1].get("state") != "active" or not masters:  # the SL lookup needs the SA (a master SM)
        print(f"ibwarn: [{os.getpid()}] sa_query: umad_recv failed: attr 0x35: Connection timed out", file=sys.stderr)
        print("Query SA failed: Connection timed out; sa call path_query failed", file=sys.stderr)
        return 0
    order = list(reversed(fabsim_sm._discover(topo, local[0])))
    fabric = common.load_fabric_or_empty(root)
    by_name = {str(s.get("name")): s for s in fabric.get("switches", [])}
    want_switch = opts["switch"] or not opts["ca"]
    want_ca = opts["ca"] or not opts["switch"]
    nodes: list[tuple[str, dict[str, Any]]] = []
    for key in order:
        if key[0] == "S" and want_switch:
            sw = topo.switches[key]
            record = by_name.get(key[1], {})
            nodes.append(("S", {"guid": sw["guid"], "desc": sw["desc"], "ports": sw["ports"],
                                "counters": {p: switch_counters(record, p) for p in range(1, sw["ports"] + 1)}}))
        elif key[0] == "H" and want_ca:
            ca = topo.cas[key]
            nodes.append(("H", {"desc": ca["desc"], "counters": {
                p: (hca.get("port_guid"), labstate.port_counters(hca)) for p, hca in ca["ports"].items()}}))
    text, rc = report(nodes, set(opts["suppressed"]))
    print(text, end="")
    if opts["clear"]:
        _clear(root, [k for k in order if k[0] == "S" and want_switch], [k for k in order if k[0] == "H" and want_ca])
    return rc


def _clear(root: str, switches: Sequence[tuple[str, ...]], cas: Sequence[tuple[str, ...]]) -> None:
    """``-k``: the error counters (not the data counters) of every port read, back to 0."""
    errors = {name for name, _ in MAD_FIELDS}
    fabric = labstate.load_fabric(root)
    for sw in fabric.get("switches", []):
        if ("S", str(sw.get("name"))) in switches:
            sw["counters"] = {p: {k: v for k, v in c.items() if k not in errors}
                              for p, c in (sw.get("counters") or {}).items()}
    labstate.save_fabric(root, fabric)
    for host in sorted({k[1] for k in cas}):
        with labstate.node_lock(root, host):
            node = labstate.load_node(root, host)
            for hca in node.get("hcas", []):
                if ("H", host, str(hca.get("device"))) in cas:
                    hca["counters"] = {k: v for k, v in labstate.port_counters(hca).items() if k not in errors}
            labstate.save_node(root, node)
