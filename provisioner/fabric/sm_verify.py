"""Subnet-manager check for ``verify``: the spec's master SM is the master, and every planned SM answers.

``links`` already proves that every port has *an* SM LID and that they all agree. That is not enough: when
the master SM dies, the standby takes over within seconds, every port follows the new SM LID and nothing
fails, yet the fabric now runs on its last SM and not the one the spec (and the SM's configuration) put in
charge. What an operator needs to hear is which SM node stopped doing its job, who is master instead, and
that the fabric has no failover left. So this check compares what ``sminfo`` reports with the spec:

* the master's port GUID must be the port GUID of the spec's elected SM (highest priority, then lowest GUID;
  :func:`provisioner.fabric.sm.expected_master`), at that port's LID;
* every SM node of the spec must answer ``sminfo <its LID>`` as master (the elected one) or standby.

Only host SMs (``subnet_manager.kind: opensm``) can be checked this way; for a switch-embedded SM or UFM the
check only asks that some SM answers, because the spec does not give its GUID.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from provisioner.fabric.findings import Finding
from provisioner.fabric.sm import SmInfo, SmView, expected_master, norm_guid
from provisioner.spec.cluster import Cluster

CHECK = "subnet_manager"
NOT_QUERIED = "not queried"


@dataclass(frozen=True)
class SmPort:
    """Where one of the spec's SMs lives: node, device, port, and what ibstat showed for that port."""

    node: str
    device: str
    port: int
    priority: int
    guid: str | None
    lid: int | None


def planned_sms(cluster: Cluster, ibstat: Mapping[str, Mapping[str, object]]) -> list[SmPort]:
    """The spec's host SMs with the port GUID/LID that ``ibstat`` shows (None when the node did not answer)."""
    sm = cluster.spec.fabric.subnet_manager
    if sm is None or sm.kind != "opensm":
        return []
    out: list[SmPort] = []
    for planned in sm.nodes:
        node = cluster.node(planned.node)
        port = next((p for p in node.ports if planned.device in (None, p.device)), None)
        if port is None:
            continue
        guid, lid = _port_identity(ibstat.get(node.name, {}), port.device, port.port)
        out.append(SmPort(node.name, port.device, port.port, planned.priority, guid, lid))
    return out


def _port_identity(ibstat: Mapping[str, object], device: str, port: int) -> tuple[str | None, int | None]:
    devices = ibstat.get("devices", [])
    for dev in devices if isinstance(devices, list) else []:
        if dev.get("name") != device:
            continue
        for p in dev.get("ports", []):
            if int(p.get("port", 1)) == port:
                guid = p.get("port_guid")
                lid = p.get("base_lid")
                return (norm_guid(str(guid)) if guid else None), (int(lid) if lid else None)
    return None, None


def _where(s: SmPort) -> str:
    return f"{s.node} {s.device}/{s.port}" + (f" (LID {s.lid})" if s.lid else "")


def _describe(info: SmInfo, sms: list[SmPort]) -> str:
    mine = next((s for s in sms if s.guid == norm_guid(info.guid)), None)
    who = f"{mine.node}" if mine else f"a foreign SM {norm_guid(info.guid)}"
    return f"{who} (priority {info.priority}, LID {info.lid})"


def sm_findings(
    cluster: Cluster,
    ibstat: Mapping[str, Mapping[str, object]],
    master: SmInfo | None,
    own: Mapping[str, SmInfo | None],
    queried_on: str,
) -> list[Finding]:
    """Findings from ``sminfo`` (``master``) and ``sminfo <lid>`` per SM node (``own``), see the module doc."""
    sms = planned_sms(cluster, ibstat)
    if master is None:
        return [Finding(
            CHECK, "error", None, None, None, "a master SM", "no answer",
            f"no subnet manager answers sminfo on {queried_on}: the fabric has no master SM",
            "start the subnet manager (systemctl start opensmd on the SM nodes; sminfo shows the master)",
        )] + [_not_answering(s, own.get(s.node), None) for s in sms if s.node in own]
    known = [s for s in sms if s.guid is not None]
    if not known:
        return []  # switch/UFM SM or no SM node answered ibstat: nothing to compare beyond "an SM answers"
    views = [SmView(s.node, s.guid or "", s.priority, master, own.get(s.node)) for s in known]
    want_guid, want_prio = expected_master(views)
    want = next(s for s in known if s.guid == want_guid)
    found: list[Finding] = []
    if norm_guid(master.guid) != want_guid:
        ours = any(s.guid == norm_guid(master.guid) for s in known)
        found.append(Finding(
            CHECK, "error", want.node, want.device, want.port,
            f"master {want.node} {want_guid} (priority {want_prio}, LID {want.lid})",
            f"master {norm_guid(master.guid)} (priority {master.priority}, LID {master.lid})",
            f"{want.node} is not the master SM: {_describe(master, sms)} is"
            + (" (the standby took over; the fabric has no failover SM left)" if ours else "")
            + f"; the SM LID moved from {want.lid} to {master.lid}",
            f"on {want.node}: systemctl status opensmd and its log (/var/log/opensm.log); start it again. "
            "A returning higher-priority SM takes mastership back unless the opensm role lowered its priority "
            "(opensm_handover: false)" if ours else
            "a foreign SM (switch-embedded, UFM, another team's opensm) runs the fabric: stop it or lower its "
            "priority below the spec's SMs",
            rail=None,
        ))
    for s in known:
        if s.node not in own:
            continue
        mine = own[s.node]
        wanted = "master" if s.guid == want_guid else "standby"
        if mine is None or norm_guid(mine.guid) != s.guid or mine.state not in ("master", "standby"):
            if s.guid == want_guid and found:
                continue  # already said: the elected SM is not master
            found.append(_not_answering(s, mine, wanted))
    return found


def _not_answering(s: SmPort, mine: SmInfo | None, wanted: str | None) -> Finding:
    observed = "no answer" if mine is None else f"{mine.state} {norm_guid(mine.guid)}"
    role = wanted or "an SM"
    return Finding(
        CHECK, "error", s.node, s.device, s.port, role, observed,
        f"the SM on {_where(s)} does not run as {role}: sminfo {s.lid or '?'} gives {observed}"
        + ("; there is no failover SM" if wanted == "standby" else ""),
        f"on {s.node}: systemctl status opensmd; journalctl -u opensmd",
    )
