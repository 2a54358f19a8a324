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
    return {
        "engine_in_use": report.engine_in_use,
        "adaptive_routing": report.adaptive_routing,
        "ar_cycles": report.ar_cycles,
        "subnet_up": report.subnet_up,
        "warnings": list(report.warnings),
        "problems": list(mod.check_adaptive_routing(report, bool(wanted), list(engines))),
    }


class FilterModule:
    """opensm role filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "opensm_sminfo": opensm_sminfo,
            "opensm_guid": opensm_guid,
            "opensm_preflight": opensm_preflight,
            "opensm_election": opensm_election,
            "opensm_routing": opensm_routing,
        }
