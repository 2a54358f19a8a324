"""What each managed switch must be told, derived from the spec alone (pure: no connection, no clock).

A *managed* switch is one with both `device_type` and `address` in the spec. Its plan is a list of command
blocks plus read-back checks: after the push, the same switch is asked what it now runs, and a check whose
answer differs from the spec fails the switch. `display(cluster)` renders all of it for a person to review
before anything is pushed.

Every value that reaches a command line comes from the validated spec: small integers with ranges enforced by
pydantic, and switch names matching the host-name pattern, so no quoting is needed here.

CLI syntax, by device type (checked against the vendors' documentation):

* MLNX-OS (`mellanox_mlnxos`, InfiniBand): `ib sm` / `no ib sm` in config mode, `show ib sm`
  https://docs.nvidia.com/networking/display/MLNXOSv3104300/SM+Commands ; SM priority with
  `ib smnode <hostname> sm-priority <0-15>` (the "Subnet Manager" page,
  https://docs.nvidia.com/networking/display/nvidiamlnxosusermanualv3113006/subnet+manager) ; `configuration write`
  saves (netmiko's MellanoxMlnxosSSH.save_config sends the same).
* Cumulus Linux 5.x with NVUE (`nvidia_nvue`, and `cumulus_linux`, whose RoCE settings the Cumulus 5.x guide says
  can only be made with NVUE; NCLU is gone since 5.0):
  https://docs.nvidia.com/networking-ethernet-software/cumulus-linux-514/Layer-1-and-Switch-Ports/Quality-of-Service/RDMA-over-Converged-Ethernet-RoCE/
  (`nv set qos roce mode lossless`, `nv set qos pfc default-global switch-priority N`,
  `nv set qos egress-queue-mapping default-global switch-priority N traffic-class 3`,
  `nv set qos mapping default-global dscp D switch-priority N`, `nv show qos roce`) and
  https://docs.nvidia.com/networking-ethernet-software/cumulus-linux-514/Layer-1-and-Switch-Ports/Quality-of-Service/
  (`nv set qos mapping default-global trust l3|l2`,
  `nv set qos congestion-control default-global traffic-class T ecn enable|min-threshold|max-threshold`).
* SONiC (`dell_sonic`): the community click CLI of sonic-utilities (doc/Command-Reference.md):
  `config qos reload`, `config interface pfc priority <if> <prio> on`, `config interface mtu <if> <mtu>`,
  `ecnconfig -p AZURE_LOSSLESS -gmin <bytes> -gmax <bytes>`, `config save -y`. Display only for now: netmiko's
  dell_sonic driver enters the Klish `sonic-cli`, where these commands do not exist (docs/operations.md, "Switches").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from provisioner.errors import ParseError
from provisioner.spec.cluster import Cluster, SwitchX

Mode = Literal["config", "exec"]

DOC_MLNXOS_SM = "https://docs.nvidia.com/networking/display/MLNXOSv3104300/SM+Commands"
DOC_MLNXOS_SM_PRIORITY = "https://docs.nvidia.com/networking/display/nvidiamlnxosusermanualv3113006/subnet+manager"
DOC_NVUE_ROCE = ("https://docs.nvidia.com/networking-ethernet-software/cumulus-linux-514/Layer-1-and-Switch-Ports/"
                 "Quality-of-Service/RDMA-over-Converged-Ethernet-RoCE/")
DOC_NVUE_QOS = ("https://docs.nvidia.com/networking-ethernet-software/cumulus-linux-514/Layer-1-and-Switch-Ports/"
                "Quality-of-Service/")
DOC_SONIC_CLI = "https://github.com/sonic-net/sonic-utilities/blob/master/doc/Command-Reference.md"

# The switch SM is the fabric's only SM when the spec chooses it (host SM nodes must be hosts), so it gets the
# highest priority: nothing else should win the election.
SWITCH_SM_PRIORITY = 15
# NVUE's RoCE modes put RoCE in traffic class 3 and CNPs in 6 (the guide's default table); ECN is set on TC 3.
ROCE_TRAFFIC_CLASS = 3
# The Cumulus RoCE defaults: ECN marking from 150 KB, all marked from 1500 KB (absolute, in bytes).
ECN_MIN_BYTES = 150_000
ECN_MAX_BYTES = 1_500_000
# SONiC names front-panel ports by their first lane: Ethernet0, Ethernet4, ... on 4-lane ports.
SONIC_LANES_PER_PORT = 4

NETMIKO_TYPE = {
    "mellanox_mlnxos": "mellanox_mlnxos",
    # netmiko has no NVUE driver; an NVUE switch is a Linux shell where `nv` runs, which is its cumulus_linux driver
    "nvidia_nvue": "cumulus_linux",
    "cumulus_linux": "cumulus_linux",
    "dell_sonic": "dell_sonic",
}
APPLY_SUPPORTED = frozenset({"mellanox_mlnxos", "nvidia_nvue", "cumulus_linux"})


@dataclass(frozen=True)
class Block:
    """Commands pushed together. `mode` config: inside the CLI's configuration mode; exec: one by one."""

    title: str
    commands: tuple[str, ...]
    mode: Mode
    source: str


@dataclass(frozen=True)
class Check:
    """A read-back: run `command`, parse it with `parser`, expect `field` to read `want` (`a|b`: either)."""

    command: str
    parser: Literal["show_ib_sm", "nv_show_qos_roce"]
    field: str
    want: str
    why: str

    def accepts(self, value: str | None) -> bool:
        return value is not None and value in self.want.split("|")


@dataclass(frozen=True)
class SwitchPlan:
    name: str
    address: str
    device_type: str
    netmiko_type: str
    spec_index: int
    blocks: tuple[Block, ...]
    save: str | None
    checks: tuple[Check, ...]
    reads: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def apply_supported(self) -> bool:
        return self.device_type in APPLY_SUPPORTED


# --- per device type -------------------------------------------------------------------------------------------
def _wants_switch_sm(cluster: Cluster, sw: SwitchX) -> bool:
    """The switch's embedded SM runs only when the spec picks the switch SM and names (or flags) this switch."""
    sm = cluster.spec.fabric.subnet_manager
    return sm is not None and sm.kind == "switch" and (sm.switch == sw.name or sw.embedded_sm)


def _mlnxos(cluster: Cluster, sw: SwitchX) -> tuple[list[Block], str | None, list[Check], list[str], list[str]]:
    if cluster.spec.fabric.type != "infiniband":
        return [], None, [], [], [f"MLNX-OS on a {cluster.spec.fabric.type} fabric: nothing planned"]
    if _wants_switch_sm(cluster, sw):
        block = Block("enable the embedded subnet manager (the spec picks this switch's SM)",
                      ("ib sm", f"ib smnode {sw.name} sm-priority {SWITCH_SM_PRIORITY}"), "config",
                      f"{DOC_MLNXOS_SM} ; {DOC_MLNXOS_SM_PRIORITY}")
        want, why = "enabled", "the spec runs the fabric's SM on this switch"
    else:
        kind = cluster.spec.fabric.subnet_manager.kind if cluster.spec.fabric.subnet_manager else "none"
        block = Block(f"disable the embedded subnet manager (subnet_manager.kind is {kind})", ("no ib sm",),
                      "config", DOC_MLNXOS_SM)
        want, why = "disabled", "a second SM would fight the host SMs for mastership"
    checks = [Check("show ib sm", "show_ib_sm", "sm", want, why)]
    return [block], "configuration write", checks, ["show ib sm", "show interfaces ib status"], []


def _nvue(cluster: Cluster, sw: SwitchX) -> tuple[list[Block], str | None, list[Check], list[str], list[str]]:
    roce = cluster.spec.fabric.roce
    if cluster.spec.fabric.type != "roce" or roce is None:
        return [], None, [], [], [f"{sw.device_type} on a {cluster.spec.fabric.type} fabric: nothing planned"]
    tc = ROCE_TRAFFIC_CLASS
    blocks: list[Block] = []
    checks: list[Check] = []
    if roce.pfc_priority is not None:
        p = roce.pfc_priority
        blocks.append(Block("lossless RoCE with PFC on the RoCE priority", (
            "nv set qos roce mode lossless",
            f"nv set qos pfc default-global switch-priority {p}",
            f"nv set qos egress-queue-mapping default-global switch-priority {p} traffic-class {tc}",
        ), "exec", DOC_NVUE_ROCE))
        checks += [Check("nv show qos roce", "nv_show_qos_roce", "mode", "lossless", "PFC needs lossless mode"),
                   Check("nv show qos roce", "nv_show_qos_roce", "pfc-priority", str(p),
                         "PFC must pause the priority RoCE uses")]
    else:
        blocks.append(Block("lossy RoCE (no PFC priority in the spec)", ("nv set qos roce mode lossy",), "exec",
                            DOC_NVUE_ROCE))
        checks.append(Check("nv show qos roce", "nv_show_qos_roce", "mode", "lossy", "no PFC priority given"))
    prio = roce.pfc_priority if roce.pfc_priority is not None else 3
    trust: tuple[str, ...]
    if roce.trust == "dscp":
        trust = ("nv set qos mapping default-global trust l3",
                 f"nv set qos mapping default-global dscp {roce.dscp} switch-priority {prio}")
        want_trust = "dscp|both"  # lossless mode trusts both PCP and DSCP by default, which also classifies DSCP
    else:
        trust = ("nv set qos mapping default-global trust l2",)
        want_trust = "pcp"
    blocks.append(Block(f"classify RoCE by {roce.trust.upper()} (DSCP {roce.dscp} -> priority {prio})", trust,
                        "exec", DOC_NVUE_QOS))
    checks.append(Check("nv show qos roce", "nv_show_qos_roce", "trust-mode", want_trust,
                        "the switch must classify RoCE the way the NICs mark it"))
    cc = f"nv set qos congestion-control default-global traffic-class {tc}"
    if roce.ecn:
        blocks.append(Block(f"ECN marking on traffic class {tc} (DCQCN)", (
            f"{cc} min-threshold {ECN_MIN_BYTES}", f"{cc} max-threshold {ECN_MAX_BYTES}", f"{cc} ecn enable",
        ), "exec", DOC_NVUE_QOS))
        checks.append(Check("nv show qos roce", "nv_show_qos_roce", "congestion-mode", "ECN",
                            "DCQCN needs ECN marks from the switch"))
    else:
        blocks.append(Block(f"no ECN marking on traffic class {tc} (spec: ecn false)", (f"{cc} ecn disable",),
                            "exec", DOC_NVUE_QOS))
    blocks.append(Block(f"MTU {roce.mtu} on every front-panel port", (
        f"nv set interface swp1-{sw.ports} link mtu {roce.mtu}",), "exec", DOC_NVUE_QOS))
    return blocks, "nv config apply -y", checks, ["nv show qos roce"], []


def _sonic(cluster: Cluster, sw: SwitchX) -> tuple[list[Block], str | None, list[Check], list[str], list[str]]:
    roce = cluster.spec.fabric.roce
    if cluster.spec.fabric.type != "roce" or roce is None:
        return [], None, [], [], [f"SONiC on a {cluster.spec.fabric.type} fabric: nothing planned"]
    ports = [f"Ethernet{i * SONIC_LANES_PER_PORT}" for i in range(sw.ports)]
    blocks = [Block("load the platform's default lossless QoS (DSCP->TC maps, buffers)", ("sudo config qos reload -y",),
                    "exec", DOC_SONIC_CLI)]
    if roce.pfc_priority is not None:
        blocks.append(Block(f"PFC on priority {roce.pfc_priority} on every port", tuple(
            f"sudo config interface pfc priority {p} {roce.pfc_priority} on" for p in ports), "exec", DOC_SONIC_CLI))
    if roce.ecn:
        blocks.append(Block("ECN thresholds on the lossless profile", (
            f"sudo ecnconfig -p AZURE_LOSSLESS -gmin {ECN_MIN_BYTES} -gmax {ECN_MAX_BYTES}",), "exec", DOC_SONIC_CLI))
    blocks.append(Block(f"MTU {roce.mtu} on every port", tuple(
        f"sudo config interface mtu {p} {roce.mtu}" for p in ports), "exec", DOC_SONIC_CLI))
    notes = [f"trust {roce.trust}: SONiC's default QoS maps DSCP to TCs; check DSCP {roce.dscp} lands in the "
             "lossless TC (show qos map dscp-tc)",
             "display only: `provision switches --apply` does not push to dell_sonic yet"]
    return blocks, "sudo config save -y", [], ["show pfc priority"], notes


_PLANNERS = {"mellanox_mlnxos": _mlnxos, "nvidia_nvue": _nvue, "cumulus_linux": _nvue, "dell_sonic": _sonic}


def plan_switch(cluster: Cluster, sw: SwitchX) -> SwitchPlan | None:
    """The plan for one switch, or None when it is unmanaged (no device_type or no address)."""
    if sw.device_type is None or sw.address is None:
        return None
    blocks, save, checks, reads, notes = _PLANNERS[sw.device_type](cluster, sw)
    index = int(sw.path[1]) if len(sw.path) > 1 else 0
    return SwitchPlan(name=sw.name, address=sw.address, device_type=sw.device_type,
                      netmiko_type=NETMIKO_TYPE[sw.device_type], spec_index=index, blocks=tuple(blocks),
                      save=save if blocks else None, checks=tuple(checks), reads=tuple(reads), notes=tuple(notes))


def plan_cluster(cluster: Cluster) -> list[SwitchPlan]:
    """Plans for every managed switch, in spec order."""
    return [p for p in (plan_switch(cluster, sw) for sw in cluster.switches) if p is not None]


# --- review text -----------------------------------------------------------------------------------------------
def render_plan(plan: SwitchPlan) -> str:
    """One switch's plan as text: blocks with their reason and source, then the save and the read-backs."""
    out = [f"# {plan.name} ({plan.address}) — {plan.device_type} (netmiko: {plan.netmiko_type})"]
    out += [f"# note: {n}" for n in plan.notes]
    for b in plan.blocks:
        out.append(f"## {b.title}")
        out.append(f"##   source: {b.source}")
        if b.mode == "config":
            out.append("configure terminal")
            out += [f"  {c}" for c in b.commands]
            out.append("exit")
        else:
            out += list(b.commands)
    if plan.save:
        out.append("## save")
        out.append(plan.save)
    for c in plan.checks:
        out.append(f"## expect: `{c.command}` {c.field} = {c.want}  ({c.why})")
    return "\n".join(out) + "\n"


def display(cluster: Cluster) -> str:
    """Every managed switch's plan, for a person to review before `--apply` (no connection is made)."""
    plans = plan_cluster(cluster)
    if not plans:
        return "# no managed switches (a switch needs device_type and address)\n"
    return "\n".join(render_plan(p) for p in plans)


# --- read-back parsers -----------------------------------------------------------------------------------------
def parse_show_ib_sm(text: str) -> dict[str, str]:
    """`show ib sm` (MLNX-OS) → {"sm": "enabled"|"disabled"}.

    The manual documents the command as reporting whether the SM runs on the node; it prints the state as a
    word. Accept enable/enabled/disable/disabled on the first non-empty line that carries one.
    """
    for line in text.splitlines():
        words = line.strip().lower().rstrip(".").split()
        for w in words:
            if w in ("enable", "enabled"):
                return {"sm": "enabled"}
            if w in ("disable", "disabled"):
                return {"sm": "disabled"}
    raise ParseError("`show ib sm` printed no enable/disable state", hint=_excerpt(text))


def parse_nv_show_qos_roce(text: str) -> dict[str, str]:
    """`nv show qos roce` (NVUE) → its system-level settings by key, value from the last column (applied).

    The output is a two-column table (operational, applied) of indented keys, then mapping tables headed by `===`
    underlines, which are not read. `trust-mode` is reduced to the value the spec compares (dscp/pcp/both).
    """
    rows: dict[str, str] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if i + 1 < len(lines) and lines[i + 1].startswith("==="):
            break
        if not line.strip() or line.startswith("---") or ("operational" in line and "applied" in line):
            continue
        parts = re.split(r"\s{2,}", line.strip())
        if len(parts) >= 2:
            rows[parts[0]] = parts[-1]
    if "mode" not in rows and "enable" not in rows:
        raise ParseError("not `nv show qos roce` output (no mode/enable row)", hint=_excerpt(text))
    trust = rows.get("trust-mode")
    if trust is not None:
        kinds = {t.strip() for t in trust.split(",")}
        rows["trust-mode"] = "both" if {"pcp", "dscp"} <= kinds else trust.strip()
    return rows


PARSERS = {"show_ib_sm": parse_show_ib_sm, "nv_show_qos_roce": parse_nv_show_qos_roce}


def _excerpt(text: str) -> str:
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return f"first line: {first[:80]!r}" if first else "the output was empty"
