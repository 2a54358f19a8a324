"""Subnet-manager decisions: preflight before starting opensm, election check after, and
whether adaptive routing is really in use.

The opensm role feeds this module what the node printed (``sminfo``, ``sminfo <lid>``, the
opensm log) through its filter plugin; the lab tests and ``verify`` use it directly.  All
functions are pure: text and numbers in, decisions and problem strings out.

Election rule (IBA 14.4.1, what opensm implements): the SM with the higher priority wins,
on equal priority the lower port GUID wins.  A master that sees a "better" SM hands over to
it, so a returning primary takes its role back unless it comes back with a lower priority:
that is how ``opensm_handover: false`` is honoured (see :func:`preflight`).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from provisioner.errors import ParseError
from provisioner.parsers import parse

SM_STATE_NAMES = {0: "notactive", 1: "discovering", 2: "standby", 3: "master"}
"""SMInfo.SMState numbers (IBA table 156) as the sminfo parser names them."""

_GUID_RE = re.compile(r"^(?:0x)?([0-9a-fA-F]{1,16})$")
_GID_RE = re.compile(r"^[0-9a-fA-F]{4}(?::[0-9a-fA-F]{4}){7}$")
# Lines sminfo prints when no SM answers on the port's SM LID (infiniband-diags, mad_rpc).
_NO_SM_MARKERS = ("iberror: failed: query", "_do_madrpc: recv failed", "mad_rpc: _do_madrpc failed")


@dataclass(frozen=True)
class SmInfo:
    """One SM as an SMInfo query reports it."""

    guid: str
    lid: int
    priority: int
    state: str
    activity_count: int = 0


def norm_guid(value: str | int) -> str:
    """``0x`` + 16 lower-case hex digits, so GUIDs from sysfs, sminfo and YAML compare equal."""
    if isinstance(value, int):
        number = value
    else:
        m = _GUID_RE.match(value.strip())
        if not m:
            raise ParseError(f"not a 64-bit GUID: {value!r}")
        number = int(m.group(1), 16)
    if not 0 <= number < 2**64:
        raise ParseError(f"GUID out of range: {value!r}")
    return f"0x{number:016x}"


def port_guid_from_gid(gid: str) -> str:
    """The port GUID is the interface ID, the low 64 bits of GID index 0 (sysfs ``gids/0``)."""
    text = gid.strip()
    if not _GID_RE.match(text):
        raise ParseError(f"not a GID (8 groups of 4 hex digits): {text!r}")
    groups = text.split(":")
    guid = norm_guid("".join(groups[4:]))
    if guid == norm_guid(0):
        raise ParseError(f"GID {text} has no interface ID: is the port initialised?")
    return guid


def read_sminfo(text: str) -> SmInfo:
    """An ``sminfo`` line through the shared parser; a failed run or a line cut by a filter is a ParseError."""
    rec = parse("sminfo", text)
    if not rec["ok"]:
        raise ParseError(f"sminfo failed: {rec['error']}")
    if rec["lid"] is None or rec["guid"] is None:
        raise ParseError(f"sminfo printed no sm lid and guid: {text.strip()[:120]!r}")
    return SmInfo(
        guid=norm_guid(str(rec["guid"])),
        lid=int(rec["lid"]),
        priority=int(rec["priority"]),
        state=str(rec["state"]),
        activity_count=int(rec["activity_count"]),
    )


def sminfo_result(rc: int, stdout: str, stderr: str = "") -> SmInfo | None:
    """``sminfo`` as run by the role: None when no SM answers, else the SM it reports.

    A timeout is the normal answer on a fabric without SM (the port has no SM LID yet);
    anything else that is not an sminfo line is an error the operator must see.
    """
    if rc == 0 and stdout.strip():
        return read_sminfo(stdout)
    both = f"{stdout}\n{stderr}"
    if any(marker in both for marker in _NO_SM_MARKERS):
        return None
    raise ParseError(f"sminfo failed with exit status {rc} and no known message: {both.strip()[:200]!r}")


def parse_sminfo_records(text: str) -> list[SmInfo]:
    """Every ``SMInfoRecord dump:`` block (``saquery SMIR``).

    Field layout from infiniband-diags ``saquery.c`` (dump_sm_info_record): ``LID``,
    ``GUID``, ``ActCount``, ``Priority``, ``SMState`` as ``name....value`` lines.
    """
    records: list[SmInfo] = []
    for block in text.split("SMInfoRecord dump:")[1:]:
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.strip().partition("..")
            if sep and key not in fields:
                fields[key] = value.lstrip(".").strip()
        try:
            state = int(fields["SMState"])
            records.append(
                SmInfo(
                    guid=norm_guid(fields["GUID"]),
                    lid=int(fields["LID"]),
                    priority=int(fields["Priority"]),
                    state=SM_STATE_NAMES.get(state, str(state)),
                    activity_count=int(fields.get("ActCount", "0")),
                )
            )
        except (KeyError, ValueError) as exc:
            raise ParseError(f"SMInfoRecord without {exc}: {block.strip()[:120]!r}") from exc
    if not records:
        raise ParseError("no 'SMInfoRecord dump:' block in the saquery output")
    return records


def beats(priority: int, guid: str, other_priority: int, other_guid: str) -> bool:
    """True when SM (priority, guid) wins the election against the other one."""
    if priority != other_priority:
        return priority > other_priority
    return int(norm_guid(guid), 16) < int(norm_guid(other_guid), 16)


# ---------------------------------------------------------------- preflight


@dataclass(frozen=True)
class Preflight:
    """What the role does before (re)starting this node's SM."""

    action: Literal["start", "refuse"]
    priority: int
    """sm_priority to render (lower than planned only to honour ``handover: false``)."""
    reason: str


def preflight(
    master: SmInfo | None,
    guid: str,
    priority: int,
    *,
    own_guids: Collection[str] = (),
    allow_takeover: bool = False,
    handover: bool = False,
) -> Preflight:
    """Decide whether this SM may start, and at which priority.

    ``master`` is what ``sminfo`` reported on this node (None: no SM answers).
    ``own_guids`` are the port GUIDs of this cluster's SM nodes: a master among them is
    part of the plan, any other master is foreign (a switch-embedded SM, another team's
    opensm) and is never displaced silently.
    """
    me = norm_guid(guid)
    if master is None:
        return Preflight("start", priority, "no subnet manager answers on the fabric")
    current = norm_guid(master.guid)
    if current == me:
        return Preflight("start", priority, "this SM is already the master")
    ours = current in {norm_guid(g) for g in own_guids}
    # A foreign master is guarded more strictly than the election rule: equal priority
    # counts as competing even when the GUID tie-break would leave it master today.
    if not (beats(priority, me, master.priority, current) or (not ours and priority >= master.priority)):
        return Preflight(
            "start", priority, f"master {current} (priority {master.priority}) outranks this SM: it joins as standby"
        )
    if not ours:
        if allow_takeover:
            return Preflight("start", priority, f"taking over from foreign master {current} (opensm_allow_takeover)")
        return Preflight(
            "refuse",
            priority,
            f"a foreign subnet manager {current} with priority {master.priority} is master; starting this SM "
            f"(priority {priority}) would take the fabric over. Stop or lower the other SM, or set "
            "opensm_allow_takeover: true to take over on purpose",
        )
    if handover:
        return Preflight("start", priority, f"taking the master role back from {current} (opensm_handover: true)")
    if master.priority == 0:
        return Preflight(
            "refuse",
            priority,
            f"standby {current} became master with priority 0; this SM cannot rejoin below it. Set "
            "opensm_handover: true to take the master role back",
        )
    return Preflight(
        "start",
        master.priority - 1,
        f"{current} took over as master; opensm_handover is false, so this SM rejoins as standby with "
        f"priority {master.priority - 1} until a planned handover",
    )


# ---------------------------------------------------------------- post-start election check


@dataclass(frozen=True)
class SmView:
    """What one SM node reports after its SM started."""

    host: str
    guid: str
    priority: int
    """The priority this SM runs with (after preflight)."""
    master: SmInfo | None
    """``sminfo`` (queries the port's SM LID: the master)."""
    own: SmInfo | None
    """``sminfo <own LID>``: this SM's own SMInfo."""


def expected_master(views: Sequence[SmView], foreign: SmInfo | None = None) -> tuple[str, int]:
    """(GUID, priority) of the SM that must win among ours and a tolerated foreign master."""
    if not views and foreign is None:
        raise ValueError("no SM to elect")
    candidates = [(v.priority, norm_guid(v.guid)) for v in views]
    if foreign is not None:
        candidates.append((foreign.priority, norm_guid(foreign.guid)))
    best = candidates[0]
    for cand in candidates[1:]:
        if beats(cand[0], cand[1], best[0], best[1]):
            best = cand
    return best[1], best[0]


def check_election(views: Sequence[SmView], foreign: SmInfo | None = None) -> list[str]:
    """Problems with the election: exactly one master, the expected one, seen by every SM."""
    problems: list[str] = []
    want_guid, want_prio = expected_master(views, foreign)
    masters = [v for v in views if v.own is not None and v.own.state == "master"]
    if foreign is None and len(masters) != 1:
        names = ", ".join(v.host for v in masters) or "none"
        problems.append(f"expected exactly one master SM, found {len(masters)} ({names})")
    for view in views:
        mine = norm_guid(view.guid)
        if view.master is None:
            problems.append(f"{view.host}: no subnet manager answers sminfo")
            continue
        if norm_guid(view.master.guid) != want_guid:
            problems.append(f"{view.host}: reports master {view.master.guid}, expected {want_guid}")
        elif view.master.priority != want_prio:
            problems.append(
                f"{view.host}: master {want_guid} runs priority {view.master.priority}, expected {want_prio}"
            )
        if view.master.state != "master":
            problems.append(f"{view.host}: the SM at the SM LID is {view.master.state}, not master")
        want_state = "master" if mine == want_guid else "standby"
        if view.own is None:
            problems.append(f"{view.host}: its own SM does not answer sminfo (not running?)")
        elif view.own.state != want_state:
            problems.append(f"{view.host}: own SM is {view.own.state}, expected {want_state}")
        elif norm_guid(view.own.guid) != mine:
            problems.append(f"{view.host}: own LID answers with GUID {view.own.guid}, expected {mine}")
    return problems


# ---------------------------------------------------------------- adaptive routing


_LOG_START_RE = re.compile(r"\] 0x03 -> OpenSM ")
_TABLES_RE = re.compile(r"(?:osm_ucast_mgr_process: )?(\S+) tables configured on all switches")
_SETUP_RE = re.compile(r"'([^']+)' routing engine set up")
_FAILED_RE = re.compile(r"cannot find or setup routing engine '([^']+)'")
_AR_CYCLE_RE = re.compile(r"AR Manager - Configuration cycle \(number (\d+)\) completed successfully")


@dataclass
class RoutingReport:
    """What the master's log says about routing since the SM last started."""

    engine_in_use: str | None = None
    engines_set_up: list[str] = field(default_factory=list)
    engines_failed: list[str] = field(default_factory=list)
    ar_cycles: int = 0
    subnet_up: bool = False
    warnings: list[str] = field(default_factory=list)

    @property
    def adaptive_routing(self) -> bool:
        """AR is live only when an ``ar_*`` engine routes the fabric."""
        return bool(self.engine_in_use and self.engine_in_use.startswith("ar_"))


def routing_from_log(text: str) -> RoutingReport:
    """Read the routing engine in use from an opensm log (the part after the last start).

    Real NVIDIA opensm (5.21, log flags 0x03) prints ``osm_ucast_mgr_process: ar_updn tables
    configured on all switches`` and ``AR Manager - Configuration cycle (number N) completed
    successfully``; upstream prints ``cannot find or setup routing engine 'ar_updn'`` and
    routes with minhop.  ``'x' routing engine set up`` is a DEBUG line in real opensm and is
    used only when no ``tables configured`` line exists (with a warning).
    """
    lines = text.splitlines()
    start = 0
    for i, line in enumerate(lines):
        if _LOG_START_RE.search(line):
            start = i
    report = RoutingReport()
    for line in lines[start:]:
        if m := _TABLES_RE.search(line):
            report.engine_in_use = m.group(1)
        elif m := _SETUP_RE.search(line):
            report.engines_set_up.append(m.group(1))
        elif m := _FAILED_RE.search(line):
            report.engines_failed.append(m.group(1))
        elif m := _AR_CYCLE_RE.search(line):
            report.ar_cycles = max(report.ar_cycles, int(m.group(1)))
        elif line.rstrip().endswith("-> SUBNET UP"):
            report.subnet_up = True
    if report.engine_in_use is None and report.engines_set_up:
        report.engine_in_use = report.engines_set_up[0]
        report.warnings.append(
            f"no 'tables configured on all switches' line: judged from the set-up engine {report.engine_in_use!r}"
        )
    return report


def check_adaptive_routing(report: RoutingReport, wanted: bool, engines: Sequence[str]) -> list[str]:
    """Problems when AR is wanted but not live (or live though not wanted)."""
    problems: list[str] = []
    if not report.subnet_up:
        problems.append("the master's log has no 'SUBNET UP' since its last start")
    for engine in report.engines_failed:
        problems.append(f"opensm could not set up routing engine {engine!r} (falls back to minhop)")
    if wanted and not report.adaptive_routing:
        problems.append(
            f"adaptive routing is configured ({','.join(engines)}) but the SM routes with "
            f"{report.engine_in_use or 'an unknown engine'}"
        )
    if not wanted and report.adaptive_routing:
        problems.append(f"adaptive routing is not wanted but the SM routes with {report.engine_in_use}")
    return problems


# ---------------------------------------------------------------- partitions


def partition_members(
    partitions: Iterable[Mapping[str, object]], guids: Mapping[str, Sequence[str]]
) -> dict[str, list[str]]:
    """Partition name -> member port GUIDs; a member without discovered GUIDs is an error."""
    out: dict[str, list[str]] = {}
    for part in partitions:
        name = str(part["name"])
        members = part.get("members") or []
        if not isinstance(members, list):
            raise ValueError(f"partition {name}: members must be a list of node names")
        found: list[str] = []
        for node in members:
            node_guids = guids.get(str(node))
            if not node_guids:
                raise ValueError(f"partition {name}: no InfiniBand port GUID known for member {node}")
            found.extend(norm_guid(g) for g in node_guids)
        out[name] = found
    return out


# partitions.conf carries one comment per partition member, ``# member gpu01: 0x...,0x...``, so that a later
# converge can keep a member that does not answer with the GUIDs it had (opensm reads ``#`` lines as comments).
_MEMBER_RECORD_RE = re.compile(r"^# member (?P<node>[A-Za-z0-9._-]+): (?P<guids>.*)$")


def recorded_members(text: str) -> dict[str, list[str]]:
    """``{member: [port GUID, ...]}`` from the ``# member`` lines of a partitions.conf this role wrote."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = _MEMBER_RECORD_RE.match(line.strip())
        if not m:
            continue
        try:
            guids = [norm_guid(g.strip()) for g in m.group("guids").split(",") if g.strip()]
        except ParseError:
            continue  # a hand-edited line that is not ours: ignored, the member then needs to answer
        if guids:
            out[m.group("node")] = guids
    return out


@dataclass(frozen=True)
class MemberGuids:
    """The port GUIDs partitions.conf gets per member: read now (``guids``), kept from the last file for members
    that did not answer (``kept``), or missing (``missing``: no answer and no record)."""

    guids: dict[str, list[str]]
    kept: list[str]
    missing: list[str]


def member_guids(answers: Mapping[str, Sequence[str] | None], recorded: Mapping[str, Sequence[str]]) -> MemberGuids:
    """Each member's InfiniBand port GUIDs: what it answered (``None``: it did not), else what the current
    partitions.conf records for it. A compute node that is down must not stop the SM from managing everyone
    else's partitions; a member that never answered and was never recorded has nothing to keep."""
    guids: dict[str, list[str]] = {}
    kept: list[str] = []
    missing: list[str] = []
    for node in sorted(answers):
        live = answers[node]
        if live is not None:
            guids[node] = [norm_guid(g) for g in live]
        elif recorded.get(node):
            guids[node] = [norm_guid(g) for g in recorded[node]]
            kept.append(node)
        else:
            missing.append(node)
    return MemberGuids(guids, kept, missing)
