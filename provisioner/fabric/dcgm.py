"""GPU acceptance: ``dcgmi diag -r <level>`` on every GPU node, and the NVSwitch fabric state where the spec has one.

DeepOps, Cluster Toolkit and azhpc-images gate a GPU node on DCGM's diagnostic; counting GPUs proves nothing about
a GPU that cannot start CUDA, has pending row remaps or fails its memory test. Each test DCGM fails is an error on
the node naming the test, the GPU(s) and DCGM's own words; a Warn is a warning, a Skip is info. These are host-side
faults (a GPU, the driver, fabric manager), never a cable: :mod:`provisioner.fabric.causes` makes the node's
GPUDirect and NCCL findings name them.

``dcgmi`` missing, or ``nv-hostengine`` not answering, is could not run with the reason (never passed, never a
hardware fault), and so is output that is not DCGM's table (quoting its first line). The diagnostic loads the GPUs:
like the traffic checks it does not run on a node running Slurm jobs (marked
:attr:`provisioner.fabric.registry.Check.traffic`).

Where a profile says ``nvswitch: true``, every GPU's ``Fabric`` section in ``nvidia-smi -q`` must read State
``Completed`` / Status ``Success``: until fabric manager has trained the NVSwitch fabric, CUDA cannot start on
the node (cuInit: 'system not yet initialized', the DCGM capture of nccl-tests #264).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from provisioner.errors import ParseError
from provisioner.fabric.findings import CheckResult, Finding, Severity
from provisioner.parsers import parse
from provisioner.parsers.nvidia_query import FABRIC_DONE, parse_nvidia_smi_fabric
from provisioner.remote import Completed
from provisioner.spec.cluster import Cluster, Node

CHECK = "dcgm"
FABRIC_CHECK = "nvswitch_fabric"

PROBE = ('command -v dcgmi >/dev/null 2>&1 || { echo "dcgmi: not found on the PATH" >&2; exit 127; }; '
         'dcgmi diag -r "$1"; rc=$?; [ "$rc" -eq 255 ] && rc=254; exit "$rc"')
"""Run as ``sh -c PROBE sh <level>``: the level is an argument, never part of the script. dcgmi's own exit 255
becomes 254: ssh reports an unreachable node as 255, and dcgmi's output must still be read."""
TIMEOUT_S = {1: 300.0, 2: 1200.0, 3: 3600.0}
"""How long each level may take (DCGM's guide: level 1 seconds, level 2 about 2 minutes, level 3 about 30)."""
FABRIC_ARGV = ("nvidia-smi", "-q")

HOST_HINT = ("a host-side fault (GPU, driver, fabric manager), not a cable: read DCGM's words, `dcgmi diag -r 3` "
             "and `nvidia-smi -q` on the node, reset or replace the GPU as NVIDIA's GPU debug guidelines say")
INSTALL_HINT = ("install datacenter-gpu-manager on the GPU nodes and enable nvidia-dcgm (nv-hostengine), "
                "e.g. `systemctl enable --now nvidia-dcgm`")
FABRIC_HINT = ("start fabric manager at the driver's exact version (`systemctl enable --now nvidia-fabricmanager`, "
               "package nvidia-fabricmanager-<branch>) and read its log; CUDA cannot start until the fabric is "
               "trained (not a cable)")
_SEVERITY: dict[str, Severity] = {"fail": "error", "warn": "warning", "skip": "info"}


def dcgm_nodes(cluster: Cluster) -> list[Node]:
    """The nodes with GPUs, by name."""
    return sorted((n for n in cluster.nodes if n.gpu_count), key=lambda n: n.name)


def level(cluster: Cluster) -> int:
    return cluster.spec.verify.dcgm.level


def _gpus(gpus: list[int] | None) -> str:
    if gpus is None:
        return "all GPUs"
    return ("GPU " if len(gpus) == 1 else "GPUs ") + ", ".join(str(g) for g in gpus)


def _words(test: dict[str, Any], kinds: tuple[str, ...]) -> str:
    return " | ".join(m["text"] for m in test["messages"] if m["kind"] in kinds)


def test_findings(node: str, lvl: int, test: dict[str, Any]) -> list[Finding]:
    """One finding for a test that did not pass (none for Pass)."""
    result = test["result"]
    severity = _SEVERITY.get(result or "")
    if severity is None:
        return []
    where = f"{test['name']} ({test['section']})" if test.get("section") else test["name"]
    if result == "fail":
        gpus = test["failed_gpus"]
        said = _words(test, ("error", "warning")) or _words(test, ("info",))
        message = f"DCGM diag level {lvl}: {where} failed on {_gpus(gpus)}" + (f": {said}" if said else "")
        return [Finding(CHECK, "error", node, None, None, "Pass", f"Fail ({_gpus(gpus)})", message, HOST_HINT)]
    said = _words(test, ("error", "warning", "info"))
    verb = "warns" if result == "warn" else "skipped"
    message = f"DCGM diag level {lvl}: {where} {verb}" + (f": {said}" if said else "")
    hint = HOST_HINT if result == "warn" else "DCGM skips a test it cannot run here (its words say why)"
    return [Finding(CHECK, severity, node, None, None, "Pass", result.capitalize(), message, hint)]


def judge_diag(node: str, lvl: int, parsed: Mapping[str, Any]) -> CheckResult:
    """The node's result from parsed ``dcgmi diag`` output (see the module docstring)."""
    if parsed.get("error"):
        return CheckResult.could_not_run(CHECK, node, f"dcgmi: {parsed['error']} (is nv-hostengine running? "
                                                      f"{INSTALL_HINT})")
    findings: list[Finding] = []
    for msg in parsed.get("section_messages", []):
        if msg["kind"] == "error":
            findings.append(Finding(CHECK, "error", node, None, None, "no error", msg["text"],
                                    f"DCGM diag level {lvl}: {msg['section'] or 'diagnostic'} error on "
                                    f"{_gpus(msg['gpus'] or None)}: {msg['text']}", HOST_HINT))
    for test in parsed["tests"]:
        findings += test_findings(node, lvl, test)
    meta = parsed.get("metadata", {})
    measured = {"level": lvl, "tests": len(parsed["tests"]),
                "passed": sum(1 for t in parsed["tests"] if t["result"] == "pass"),
                "dcgm_version": meta.get("dcgm_version")}
    return CheckResult.from_findings(CHECK, node, findings, measured)


def diag_result(node: str, lvl: int, done: Completed) -> CheckResult:
    """What one node's probe came back with: could not run (unreachable, timed out, no dcgmi, not DCGM's table),
    or the judged diagnostic."""
    if done.unreachable:
        return CheckResult.could_not_run(CHECK, node, done.stderr.strip() or "unreachable")
    if done.timed_out:
        return CheckResult.could_not_run(CHECK, node, f"dcgmi diag -r {lvl} timed out after {TIMEOUT_S[lvl]:.0f} s")
    if done.rc == 127:
        return CheckResult.could_not_run(CHECK, node, f"no dcgmi on {node}'s PATH: {INSTALL_HINT}")
    try:
        parsed = parse("dcgmi", done.stdout)
    except ParseError as exc:
        return CheckResult.could_not_run(CHECK, node, f"{exc.message} [exit {done.rc}]")
    return judge_diag(node, lvl, parsed)


def fabric_nodes(cluster: Cluster) -> list[Node]:
    """GPU nodes whose profile says NVSwitch (HGX/DGX boards: fabric manager must have trained the fabric)."""
    return [n for n in dcgm_nodes(cluster) if n.nvswitch]


def fabric_result(node: str, done: Completed) -> CheckResult:
    """Every GPU's Fabric State/Status from ``nvidia-smi -q``: Completed/Success, else an error naming fabric
    manager."""
    if done.unreachable or done.timed_out or (done.rc != 0 and not done.stdout.strip()):
        why = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.rc}"
        return CheckResult.could_not_run(FABRIC_CHECK, node, f"nvidia-smi -q: {why}")
    try:
        gpus = parse_nvidia_smi_fabric(done.stdout)["gpus"]
    except ParseError as exc:
        return CheckResult.could_not_run(FABRIC_CHECK, node, exc.message)
    if all(g["state"] is None for g in gpus):
        return CheckResult.could_not_run(FABRIC_CHECK, node, "nvidia-smi -q shows no Fabric section (a driver "
                                                             "older than 470 does not report the NVSwitch fabric)")
    findings = [Finding(FABRIC_CHECK, "error", node, None, None, "Completed / Success",
                        f"{g['state']} / {g['status']}",
                        f"NVSwitch fabric not ready on GPU {g['bus_id'] or '?'}: State {g['state']}, Status "
                        f"{g['status']}; fabric manager has not trained the fabric", FABRIC_HINT)
                for g in gpus if (g["state"], g["status"]) != FABRIC_DONE]
    return CheckResult.from_findings(FABRIC_CHECK, node, findings, {"gpus": len(gpus)})
