"""Filters of the opensm role: thin adapters to provisioner.fabric.sm (the decisions live there,
unit-tested; the role only moves command output in and decisions out)."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

sm: Any
ProvisionerError: Any
try:
    from provisioner.errors import ProvisionerError as _Error
    from provisioner.fabric import sm as _sm
except ImportError as exc:  # pragma: no cover - depends on the controller's environment
    sm, ProvisionerError, _IMPORT_ERROR = None, Exception, str(exc)
else:
    sm, ProvisionerError, _IMPORT_ERROR = _sm, _Error, ""


def _need_sm() -> Any:
    if sm is None:
        raise AnsibleFilterError(
            f"the opensm role needs the provisioner package on the controller ({_IMPORT_ERROR}); "
            "run ansible from provisioner's environment"
        )
    return sm


def _info(data: Any) -> Any:
    if not data:
        return None
    mod = _need_sm()
    return mod.SmInfo(
        guid=str(data["guid"]),
        lid=int(data.get("lid", 0)),
        priority=int(data["priority"]),
        state=str(data["state"]),
        activity_count=int(data.get("activity_count", 0)),
    )


def _as_dict(info: Any) -> dict[str, Any] | None:
    if info is None:
        return None
    return {
        "guid": info.guid,
        "lid": info.lid,
        "priority": info.priority,
        "state": info.state,
        "activity_count": info.activity_count,
    }


def opensm_sminfo(result: dict[str, Any]) -> dict[str, Any] | None:
    """A registered ``sminfo`` command result -> the SM it reports, or None when none answers."""
    mod = _need_sm()
    try:
        info = mod.sminfo_result(int(result.get("rc", 1)), str(result.get("stdout", "")),
                                 str(result.get("stderr", "")))
    except ProvisionerError as exc:
        raise AnsibleFilterError(str(exc)) from exc
    return _as_dict(info)


def opensm_guid(value: Any) -> str:
    """Normalise a GUID (``0x`` + 16 hex digits)."""
    mod = _need_sm()
    try:
        return str(mod.norm_guid(str(value)))
    except ProvisionerError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def opensm_preflight(master: Any, guid: str, priority: int, own_guids: list[str],
                     allow_takeover: bool = False, handover: bool = False) -> dict[str, Any]:
    """Preflight decision: {action, priority, reason}."""
    mod = _need_sm()
    decision = mod.preflight(_info(master), str(guid), int(priority), own_guids=list(own_guids),
                             allow_takeover=bool(allow_takeover), handover=bool(handover))
    return {"action": decision.action, "priority": decision.priority, "reason": decision.reason}


def opensm_election(views: list[dict[str, Any]], foreign: Any = None) -> list[str]:
    """Problems of the election seen from every SM node (empty list: healthy)."""
    mod = _need_sm()
    parsed = [
        mod.SmView(host=str(v["host"]), guid=str(v["guid"]), priority=int(v["priority"]),
                   master=_info(v.get("master")), own=_info(v.get("own")))
        for v in views
    ]
    return list(mod.check_election(parsed, _info(foreign)))


def opensm_routing(log_text: str, wanted: bool, engines: list[str]) -> dict[str, Any]:
    """What the master's log says about routing, and the problems against what is wanted."""
    mod = _need_sm()
    report = mod.routing_from_log(str(log_text))
    # No engine configured = the build's own default (NVIDIA's opensm 5.10 on: ar_updn, upstream: minhop):
    # whichever it routes with is accepted; failures and a missing SUBNET UP still count.
    wanted = bool(wanted) if engines else report.adaptive_routing
    return {
        "engine_in_use": report.engine_in_use,
        "adaptive_routing": report.adaptive_routing,
        "ar_cycles": report.ar_cycles,
        "subnet_up": report.subnet_up,
        "warnings": list(report.warnings),
        "problems": list(mod.check_adaptive_routing(report, bool(wanted), list(engines))),
    }


def _conf_values(text: str) -> dict[str, str]:
    """``key value`` lines of an opensm.conf (comments dropped; a later line wins, as opensm reads them)."""
    values: dict[str, str] = {}
    for raw in str(text or "").splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            key, _, value = line.partition(" ")
            values[key] = value.strip()
    return values


def opensm_conf_apply(before: str, after: str, reloadable: list[str], partitions_changed: bool = False,
                      started: bool = False) -> dict[str, Any]:
    """How a running SM takes a new configuration: {action: none|reload|restart, changed, restart_for}.

    A heavy sweep (SIGHUP) re-reads partitions.conf and the opensm.conf options that can change at runtime
    (``reloadable``); any other changed option needs a restart, and so does a reloadable option whose line
    was removed (the rescan only reads the lines present, so the running value would stay).  An SM that was
    (re)started by this run has read both files already: nothing to do.
    """
    old, new = _conf_values(before), _conf_values(after)
    changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    allowed = set(reloadable)
    restart_for = [k for k in changed if k not in allowed or k not in new]
    if started or not (changed or partitions_changed):
        action = "none"
    elif restart_for:
        action = "restart"
    else:
        action = "reload"
    return {"action": action, "changed": changed, "restart_for": restart_for}


def opensm_restart_order(plans: list[dict[str, Any]]) -> list[str]:
    """Hosts whose SM needs a restart, standbys first (lowest priority first) and the master last."""
    todo = [p for p in plans if p.get("action") == "restart"]
    todo.sort(key=lambda p: (bool(p.get("master")), int(p.get("priority", 0)), str(p["host"])))
    return [str(p["host"]) for p in todo]


def opensm_expected_master(plans: list[dict[str, Any]], foreign: Any = None) -> str:
    """GUID of the SM that must win among ours ({guid, priority} each) and a tolerated foreign master."""
    mod = _need_sm()
    views = [mod.SmView(host=str(p.get("host", "")), guid=str(p["guid"]), priority=int(p["priority"]), master=None,
                        own=None) for p in plans]
    guid, _priority = mod.expected_master(views, _info(foreign))
    return str(guid)


def opensm_member_guids(results: list[dict[str, Any]], current_conf: str = "") -> dict[str, Any]:
    """The loop results of reading each member's ports (``item`` the member) and the current partitions.conf
    text -> ``{guids: {member: [GUID]}, kept: [...], missing: [...]}`` (see provisioner.fabric.sm.member_guids)."""
    mod = _need_sm()
    answers: dict[str, list[str] | None] = {}
    for res in results or []:
        node = str(res.get("item"))
        if res.get("unreachable") or res.get("failed") or "ports" not in res:
            answers[node] = None
            continue
        answers[node] = [str(p["guid"]) for p in res["ports"]
                         if p.get("link_layer") == "InfiniBand" and p.get("guid")]
    try:
        out = mod.member_guids(answers, mod.recorded_members(str(current_conf or "")))
    except ProvisionerError as exc:
        raise AnsibleFilterError(str(exc)) from exc
    return {"guids": out.guids, "kept": out.kept, "missing": out.missing}


class FilterModule:
    """opensm role filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "opensm_sminfo": opensm_sminfo,
            "opensm_guid": opensm_guid,
            "opensm_preflight": opensm_preflight,
            "opensm_election": opensm_election,
            "opensm_routing": opensm_routing,
            "opensm_conf_apply": opensm_conf_apply,
            "opensm_restart_order": opensm_restart_order,
            "opensm_expected_master": opensm_expected_master,
            "opensm_member_guids": opensm_member_guids,
        }
