"""Xid in verify (provisioner/fabric/xid.py): a critical Xid in a GPU node's kernel log is a host-side error naming
the GPU, the code, NVIDIA's meaning and the catalog's action (reset / reboot / RMA, never a cable); the node's
traffic findings fold under it; application Xids are an info line. The kernel-log lines are real captures
(tests/fixtures/dmesg, each headed by its thread), read in the GPUDirect check's node probe: no round trip of its
own."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from provisioner.fabric import causes, gpudirect, xid
from provisioner.fabric.findings import CheckResult, Finding
from provisioner.remote import Completed
from provisioner.verify import verify
from tests.unit._parser_fixtures import load
from tests.unit.test_verify_checks import IB, cluster_from

XID79 = load("dmesg", "open_gpu_kernel_modules_1151_xid79_rtx5080.txt")
XID48 = load("dmesg", "gpu_operator_1146_xid48_dbe.txt")
XID119 = load("dmesg", "open_gpu_kernel_modules_446_xid119_gsp.txt")
XID94_APPS = load("dmesg", "akash_support_244_xid43_31_94.txt")
APPS_ONLY = load("dmesg", "gpud_xid_readme.txt")
CABLE_WORDS = re.compile(r"\b(cables?|ports?|transceivers?|reseat)\b", re.IGNORECASE)


def _gpus(*bus: str) -> str:
    """nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader as the driver prints it."""
    return "".join(f"{i}, {b}\n" for i, b in enumerate(bus))


def _errors(found: Sequence[Finding]) -> list[Finding]:
    return [f for f in found if f.severity == "error"]


def test_xid_79_names_the_gpu_by_its_index_the_meaning_and_a_reboot_not_a_cable() -> None:
    (err,) = xid.findings("gpu02", XID79, _gpus("00000000:18:00.0", "00000000:2B:00.0"))
    assert (err.node, err.device, err.observed) == ("gpu02", "gpu1", "Xid 79")
    assert err.message.startswith("gpu02: gpu1 (PCI 0000:2b:00) logged Xid 79: GPU has fallen off the bus "
                                  "(NVIDIA's Xid catalog)"), err.message
    assert "reboot the node" in err.hint and "RMA" in err.hint
    assert not CABLE_WORDS.search(err.message + " " + err.hint), err


def test_a_gpu_gone_from_nvidia_smi_is_named_by_its_address() -> None:
    (err,) = xid.findings("gpu02", XID79, _gpus("00000000:18:00.0"))
    assert err.device is None and "the GPU at PCI 0000:2b:00 (not listed by nvidia-smi) logged Xid 79" in err.message


def test_xid_48_is_a_gpu_reset_and_repeats_are_one_error_with_their_count() -> None:
    (dbe,) = xid.findings("gpu01", XID48, _gpus("00000000:07:00.0"))
    assert dbe.device == "gpu0" and "double bit ECC error" in dbe.message
    assert "reset the GPU (nvidia-smi -r -i 0)" in dbe.hint and not CABLE_WORDS.search(dbe.hint)
    (gsp,) = xid.findings("gpu03", XID119, _gpus("00000000:61:00.0", "00000000:62:00.0"))
    assert gsp.device == "gpu0" and "logged Xid 119 5 times: GSP RPC timeout" in gsp.message
    assert "Expected function 76 (GSP_RM_CONTROL) (0x20800110 0x84)" in gsp.message  # the last line is quoted
    assert "reboot if the reset fails" in gsp.hint


def test_application_xids_are_one_info_line_and_a_contained_ecc_error_beside_them_is_an_error() -> None:
    found = xid.findings("gpu04", XID94_APPS, _gpus("00000000:00:05.0", "00000000:00:07.0", "00000000:00:08.0"))
    assert [(f.severity, f.device, f.observed) for f in found] == [("error", "gpu2", "Xid 94"),
                                                                   ("info", None, "31, 43")]
    assert "contained ECC error" in found[0].message and "application" in found[1].message
    only_apps = xid.node_result("gpu01", Completed(0, f"{xid.MARK} gpus\n{xid.MARK} kernel log\n{APPS_ONLY}", ""))
    assert only_apps.passed and [f.severity for f in only_apps.findings] == ["info"]  # 13, 109: not the node's


def test_an_unreadable_kernel_log_could_not_run_never_passed() -> None:
    refused = xid.node_result("gpu01", Completed(0, f"{xid.MARK} gpus\n{xid.MARK} kernel log\ndmesg: read kernel "
                                                    "buffer failed: Operation not permitted\n", ""))
    assert not refused.ran and "Operation not permitted" in (refused.error or "")
    assert not xid.node_result("gpu01", Completed(0, "Module Size Used by\n", "")).ran  # no section: not proven


def _gdr_bad_rail(node: str) -> Finding:
    return Finding(gpudirect.BW_CHECK, "error", node, "mlx5_1", None, 360, 12, f"{node} rail 1: port is bad",
                   "reseat or swap the cable and transceiver", rail=1)


def test_a_critical_xid_is_the_host_side_cause_its_nodes_traffic_findings_fold_under() -> None:
    (err,) = xid.findings("gpu02", XID79, _gpus("00000000:18:00.0"))
    count = Finding(gpudirect.CHECK, "error", "gpu02", None, None, 2, 1, "gpu02: nvidia-smi shows 1 of 2 GPUs", "")
    checks = [CheckResult.from_findings(gpudirect.CHECK, "gpu02", [count]),
              CheckResult.from_findings(xid.CHECK, "gpu02", [err]),
              CheckResult.from_findings(gpudirect.BW_CHECK, None, [_gdr_bad_rail("gpu02"), _gdr_bad_rail("gpu01")])]
    assert causes.host_causes(checks) == {"gpu02": err}  # the Xid names why the GPU is gone: it is the cause
    mine, theirs = causes.fold(checks)[2].findings
    assert mine.message.startswith("GPUDirect bandwidth on gpu02 rail 1 fails because of a host-side cause, not a "
                                   "port or cable: gpu02: the GPU at PCI 0000:2b:00"), mine.message
    assert "reseat" not in mine.hint and "reboot the node" in mine.hint and mine.severity == "error"
    assert theirs == _gdr_bad_rail("gpu01")
    info = Finding(xid.CHECK, "info", "gpu03", None, None, None, "13", "gpu03: application Xids", "")
    assert not causes.is_host_cause(info)


class XidRemote:
    """The GPUDirect check's node commands: its probe (lsmod, then the Xid sections), topo -m, no ib_write_bw."""

    def __init__(self, logs: Mapping[str, str]) -> None:
        self.logs = dict(logs)
        self.calls: list[tuple[str, tuple[str, ...]]] = []

    def run_many(self, commands: Mapping[str, Sequence[str]], timeout: float,
                 env: Mapping[str, str] | None = None) -> dict[str, Completed]:
        out = {}
        for host, argv in sorted(commands.items()):
            self.calls.append((host, tuple(argv)))
            if list(argv) == ["sh", "-c", gpudirect.NODE_PROBE]:
                out[host] = Completed(0, (load("lsmod", "gpud39_peermem_yaml_indented.txt")
                                          + f"{xid.MARK} gpus\n" + _gpus("00000000:18:00.0", "00000000:2B:00.0")
                                          + f"{xid.MARK} kernel log\n" + self.logs.get(host, "")), "")
            elif argv[-1] == gpudirect.PERFTEST_PROBE:
                out[host] = Completed(127, "", "")
            else:
                out[host] = Completed(0 if argv[0] == "true" else 1, "", "")
        return out

    def run(self, host: str, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None) -> Completed:
        return self.run_many({host: argv}, timeout, env)[host]

    def start(self, *args: object, **kwargs: object) -> None:
        pytest.fail("no ib_write_bw server may start without a CUDA perftest")


def test_verify_reads_each_gpu_nodes_kernel_log_in_the_gpudirect_probe_and_fails_the_xid_node(tmp_path: Path) -> None:
    remote = XidRemote({"gpu02": XID79, "gpu04": APPS_ONLY})
    run = verify(cluster_from(IB), tests=["gpudirect"], remote=remote, state_dir=tmp_path,  # type: ignore[arg-type]
                 write=False)
    results = {c.node: c for c in run.report.checks if c.name == xid.CHECK}
    assert sorted(results) == ["gpu01", "gpu02", "gpu03", "gpu04"], run.report.checks
    (err,) = _errors(results["gpu02"].findings)
    assert err.device == "gpu1" and "logged Xid 79: GPU has fallen off the bus" in err.message
    assert results["gpu01"].passed and results["gpu03"].passed and results["gpu04"].passed
    assert run.exit_code != 0
    probes = [h for h, a in remote.calls if a == ("sh", "-c", gpudirect.NODE_PROBE)]
    assert probes == ["gpu01", "gpu02", "gpu03", "gpu04"]  # one probe per GPU node carries lsmod and the log
    assert not [a for _, a in remote.calls if a[0] in ("lsmod", "dmesg")], "no round trip of their own"


def test_the_labs_gpu_faults_log_what_the_probe_reads_and_judges(tmp_path: Path) -> None:
    """gpu_missing and ecc_error on the lab's simulated 8-GPU node (test_simtools_host's): NODE_PROBE itself, run by
    sh with the lab's nvidia-smi and dmesg on the PATH, gives the Xid 79 of the GPU gone from nvidia-smi and the
    Xid 48 of gpu0, which the lab test (tests/lab/test_verify_faults.py) then proves over SSH."""
    import json
    import os
    import subprocess
    import sys

    from provisioner.lab import faults
    from tests.unit.test_simtools_host import SIMTOOLS
    from tests.unit.test_simtools_host import lab as lab_fixture

    lab = lab_fixture.__wrapped__(tmp_path)  # type: ignore[attr-defined]
    path = lab / "root/nodes/gpu01/node.json"
    node = json.loads(path.read_text())
    faults.apply_fault(node, "gpu_missing", {"index": 3})
    faults.apply_fault(node, "ecc_error", {"index": 0, "count": 1})
    path.write_text(json.dumps(node))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("nvidia-smi", "dmesg"):
        (bin_dir / tool).write_text(f'#!/bin/sh\nexec {sys.executable} {SIMTOOLS / tool} "$@"\n')
    (bin_dir / "lsmod").write_text("#!/bin/sh\nprintf 'Module                  Size  Used by\\n'\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PROVISIONER_LAB_ROOT": str(lab / "root"),
           "PROVISIONER_LAB_HOST": "gpu01", "PROVISIONER_LAB_SYSROOT": str(lab / "sys")}
    done = subprocess.run(["sh", "-c", gpudirect.NODE_PROBE], capture_output=True, text=True, env=env, check=False)
    result = xid.node_result("gpu01", Completed(done.returncode, done.stdout, done.stderr))
    assert [(f.device, f.observed) for f in _errors(result.findings)] == [("gpu0", "Xid 48"), (None, "Xid 79")], \
        done.stdout
    assert "the GPU at PCI 0000:48:00 (not listed by nvidia-smi) logged Xid 79" in result.findings[1].message
    assert xid.split_probe(done.stdout)[0].startswith("Module")  # lsmod's part stays whole for its parser
