"""``verify`` over the simulated fabric on the host: the lab's tools as subprocesses, no containers.

A :class:`SimRemote` runs each command the way a node would: the simulated ``iblinkinfo``/``ibqueryerrors``/
``ib_write_bw`` with ``PROVISIONER_LAB_HOST`` set to the node, every server's TCP port moved to a free local
one (all "nodes" share 127.0.0.1). The lab is test_sim_fabric_topology's two leaves under one spine, with
the node cables and uplinks of its spec; faults go in through ``provisioner.lab.faults`` as in the lab.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from provisioner.lab import faults, fromspec, hardware
from provisioner.remote import Completed
from provisioner.spec import Cluster
from provisioner.verify import VerifyRun, verify
from tests.unit import test_sim_fabric_topology as topo
from tests.unit.test_simtools_fabric import free_port

SPEC = topo.SPEC.replace('{name: "gpu[01-02]", address: "10.0.0.[1-2]", profile: g}',
                         '{name: "gpu[01-02]", address: "10.0.0.[1-2]", profile: g}\n'
                         '  - {name: "gpu03", address: "10.0.0.3", profile: g}')
SPEC = SPEC.replace('- {nodes: "gpu[01-02]", hca: mlx5_0, switch: leaf1, ports: 1-2}',
                    '- {nodes: "gpu[01-03]", hca: mlx5_0, switch: leaf1, ports: "1,2,4"}')
SPEC = SPEC.replace('- {nodes: "gpu[01-02]", hca: mlx5_1, switch: leaf2, ports: 1-2}',
                    '- {nodes: "gpu[01-03]", hca: mlx5_1, switch: leaf2, ports: "1,2,4"}')
SPEC = SPEC.replace("uplinks: 2", "uplinks: 3").replace("ports: 8}", "ports: 10}")
SPEC += "verify: {bandwidth: {duration: 1}}\n"


class _Bg:
    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc

    def wait(self, timeout: float) -> Completed:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            return Completed(124, out, err)
        return Completed(self.proc.returncode, out, err)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


class SimRemote:
    """Implements provisioner.remote.Remote with the lab's simulated tools run on this host."""

    def __init__(self, root: Path, cluster: Cluster) -> None:
        self.root = root
        self.address = {n.address: n.name for n in cluster.nodes}
        self.ports: dict[tuple[str, str], str] = {}
        self.lock = threading.Lock()
        self.calls: list[tuple[str, tuple[str, ...]]] = []

    def _argv(self, host: str, argv: Sequence[str]) -> tuple[list[str], str]:
        args = list(argv)
        if args[0] != "ib_write_bw":
            return [topo.PY, str(topo.TOOLS / args[0]), *args[1:]], host
        i = args.index("-p")
        server = self.address.get(args[-1], host)  # the client names its server by address
        with self.lock:
            args[i + 1] = self.ports.setdefault((server, args[i + 1]), str(free_port()))
        if args[-1] in self.address:
            args[-1] = "127.0.0.1"
        return [topo.PY, str(topo.TOOLS / "ib_write_bw"), *args[1:]], host

    def _env(self, host: str) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("PROVISIONER_")}
        return {**base, "PROVISIONER_LAB_ROOT": str(self.root), "PROVISIONER_LAB_HOST": host,
                "PROVISIONER_LAB_SM_STALE_S": "600", "PROVISIONER_LAB_FLOW_SETTLE_S": "0.5",
                "PROVISIONER_LAB_PERFTEST_RETRY_S": "20"}

    def run(self, host: str, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None) -> Completed:
        self.calls.append((host, tuple(argv)))
        if argv[0] in ("true",):
            return Completed(0, "", "")
        if argv[0] == "sh":  # command -v numactl
            return Completed(1, "", "")
        cmd, _ = self._argv(host, argv)
        done = subprocess.run(cmd, env=self._env(host), capture_output=True, text=True, timeout=timeout, check=False)
        return Completed(done.returncode, done.stdout, done.stderr)

    def start(self, host: str, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None) -> _Bg:
        self.calls.append((host, tuple(argv)))
        cmd, _ = self._argv(host, argv)
        return _Bg(subprocess.Popen(cmd, env=self._env(host), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True))

    def run_many(self, commands: Mapping[str, Sequence[str]], timeout: float,
                 env: Mapping[str, str] | None = None) -> dict[str, Completed]:
        return {h: self.run(h, a, timeout, env) for h, a in sorted(commands.items())}


@pytest.fixture()
def lab(tmp_path: Path) -> tuple[Path, Cluster]:
    cluster = topo._cluster(SPEC)
    root = tmp_path / "lab"
    hardware.write_lab_state(str(root), "topo", fromspec.lab_nodes(cluster), fromspec.lab_switches(cluster),
                             fromspec.lab_cables(cluster))
    fromspec.write_switch_links(str(root), fromspec.lab_switch_links(cluster))
    topo._sweep(root, tmp_path)
    master = json.loads((root / "sm" / "sm.json").read_text())  # the --once SM exited: keep it answering
    (root / "sm" / f"{master['guid']}.json").write_text(json.dumps({**master, "heartbeat": time.time()}))
    return root, cluster


def _verify(lab: tuple[Path, Cluster], tmp_path: Path) -> VerifyRun:
    root, cluster = lab
    return verify(cluster, tests=["cabling", "bandwidth"], remote=SimRemote(root, cluster), state_dir=tmp_path,
                  server_grace_s=0.05)


def serious(run: VerifyRun) -> list[str]:
    return [f"{f.severity} {f.check} {f.location()}: {f.message}" for f in run.report.findings()
            if f.severity != "info"]


def test_healthy_fabric_passes_cabling_links_counters_and_load(lab: tuple[Path, Cluster], tmp_path: Path) -> None:
    run = _verify(lab, tmp_path)
    assert run.exit_code == 0, serious(run)
    ran = {c.name: c for c in run.report.checks}
    assert {"cabling", "switch_links", "switch_ports", "bandwidth", "fabric_load"} <= set(ran), set(ran)
    assert ran["fabric_load"].measurements["flows"] == 6 and ran["fabric_load"].measurements["flows_slow"] == 0
    assert ran["switch_ports"].measurements["counters_read"] == "start and end"
    page = (run.directory / "report.html").read_text() if run.directory else ""
    assert page.count('class="switch"') == 3 and page.count('class="port"') == 7
    assert 'data-status="error"' not in page


def test_missing_uplink_is_named_and_load_blames_the_leaf(lab: tuple[Path, Cluster], tmp_path: Path) -> None:
    root, _ = lab
    faults.inject(str(root), "leaf2", "uplink_down", port=8)
    run = _verify(lab, tmp_path)
    assert run.exit_code == 1
    errs = [f for f in run.report.findings() if f.severity == "error"]
    assert sorted((f.check, f.switch, f.port) for f in errs) == [
        ("fabric_load", "leaf2", None), ("switch_links", "leaf2", 8)], serious(run)
    links = next(f for f in errs if f.check == "switch_links")
    assert links.message == ("leaf2 port 8 ↔ spine1 port 6: missing (leaf2 port 8 is Down/Polling; spine1 port 6 "
                             "is Down/Polling)")
    leaf = next(f for f in errs if f.check == "fabric_load")
    assert leaf.message.startswith("leaf2: ") and "2 of 3 uplinks up → 1.50:1 (planned 1.00:1)" in leaf.message
    assert not [f for f in run.report.findings() if f.node and f.severity in ("error", "warning")], serious(run)
    warned = [f.message for f in run.report.findings() if f.severity == "warning"]
    assert "leaf2: 2 of 3 uplinks up → 1.50:1 (planned 1.00:1; 1200 Gb/s down, 800 of 1200 Gb/s up)" in warned
    assert any(m.startswith("leaf2 port 8 flapped 1 times") for m in warned), warned
