"""`provision discover` on a running lab: the drafted spec equals the lab's spec in nodes, hardware and cabling.

examples/lab/cluster.yaml (5 nodes, 2 leaves and a spine) is brought up through the CLI under its own name; the
GPU nodes get the stand-in driver, NCCL, CUDA and DOCA-OFED packages from the lab's signed repository (pinned as
the spec pins them) and sm1 and sm2 start NVIDIA's opensm (one master, one standby), so every source discover reads
is live: nvidia-smi, Debian's real ibstat on the simulated sysfs, the simulated ibnetdiscover, sminfo and saquery
SMIR, dpkg and ofed_info. Discover then
reaches the nodes over SSH by their addresses only (names come from the nodes), with the lab's known_hosts; a
second run with an empty known_hosts must read nothing. About 90 s on 2 loaded cores (most of it apt).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from _labspec import APT, APT_PINS, cluster_name  # type: ignore[import-not-found]

from provisioner.spec import load_cluster, load_spec

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("podman") is None, reason="needs root and podman"),
]

ROOT = Path(__file__).resolve().parents[2]
NAME = cluster_name("labdisc")
PROVISION = str(Path(sys.executable).parent / "provision")
GPU_NODES = ("gpu01", "gpu02", "gpu03")
GPU_PACKAGES = "nvidia-driver-550-open libnccl2 cuda-toolkit-12-4 doca-ofed"


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROVISION, *args], env=env, capture_output=True, text=True, timeout=600, check=False)


def _sh(host: str, command: str) -> None:
    done = subprocess.run(["podman", "exec", f"plab-{NAME}-{host}", "sh", "-c", command], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, f"{host}: {command}\n{done.stdout}\n{done.stderr}"


def _install(host: str) -> None:
    packages = GPU_PACKAGES if host in GPU_NODES else "opensm"
    _sh(host, "install -D -m 0644 /run/lab/keys/lab-vendor.gpg /etc/apt/keyrings/lab-vendor.gpg && "
              "echo 'deb [signed-by=/etc/apt/keyrings/lab-vendor.gpg] file:/run/lab/vendor-repo bookworm main'"
              " > /etc/apt/sources.list.d/lab-vendor.list && "
              f"printf '%s' {shlex.quote(APT_PINS)} > /etc/apt/preferences.d/lab-pins && "
              f"{APT} update && {APT} install -y --no-install-recommends {packages}")
    if host in GPU_NODES:
        _sh(host, "modprobe nvidia")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str], dict[str, object]]]:
    work = tmp_path_factory.mktemp("discover")
    spec = work / "cluster.yaml"
    spec.write_text((ROOT / "examples/lab/cluster.yaml").read_text().replace("{name: lab,", f"{{name: {NAME},"))
    env = {**os.environ, "PROVISIONER_LAB_DIR": os.environ.get("PROVISIONER_LAB_DIR") or str(work / "labdir")}
    try:
        up = _cli("lab", "up", str(spec), env=env)
        assert up.returncode == 0, up.stdout + up.stderr
        overlay = yaml.safe_load(Path(up.stdout.split("overlay ")[1].split()[0]).read_text())
        with ThreadPoolExecutor(max_workers=5) as pool:
            list(pool.map(_install, [*GPU_NODES, "sm1", "sm2"]))
        for host, priority in (("sm1", 15), ("sm2", 14)):  # the spec's priorities (equal ones are SM-PRIORITY-TIE)
            _sh(host, f"mkdir -p /etc/opensm && echo 'sm_priority {priority}' > /etc/opensm/opensm.conf && "
                      "systemctl start opensmd")
        yield work, env, overlay
    finally:
        down = _cli("lab", "down", NAME, env=env)
        assert down.returncode == 0, down.stdout + down.stderr


def _hardware(path: Path) -> dict[str, object]:
    c, _ = load_cluster(path)
    return {
        "nodes": {n.name: (n.gpu_model, n.gpu_count, n.nvswitch,
                           sorted((p.device, p.port, p.rate_gbps, p.width, p.link_layer, p.rail, p.gpu)
                                  for p in n.ports)) for n in c.nodes},
        "cables": sorted((x.node, x.device, x.switch, x.switch_port) for x in c.cables),
        "switches": sorted((s.name, s.tier, s.ports, s.uplinks) for s in c.switches),
    }


def test_discovered_spec_equals_the_lab_spec(lab: tuple[Path, dict[str, str], dict[str, object]]) -> None:
    work, env, overlay = lab
    ssh = overlay["ssh"]
    addresses: dict[str, str] = overlay["addresses"]  # type: ignore[assignment]
    assert isinstance(ssh, dict)
    draft = work / "draft.yaml"
    done = _cli("discover", ",".join(sorted(addresses.values())), "--user", ssh["user"], "--key", ssh["key"],
                "--known-hosts", ssh["known_hosts"], "--name", NAME, "--out", str(draft), env=env)
    assert done.returncode == 0, done.stdout + done.stderr + (draft.read_text() if draft.exists() else "")
    assert "Traceback" not in done.stderr
    assert _hardware(draft) == _hardware(work / "cluster.yaml"), draft.read_text()
    drafted, _ = load_cluster(draft)
    assert {n.name: n.address for n in drafted.nodes} == addresses
    text = draft.read_text()
    sms = yaml.safe_load(text)["fabric"]["subnet_manager"]["nodes"]
    assert sms == [{"node": "sm1", "priority": 15}, {"node": "sm2", "priority": 14}], text  # from saquery SMIR
    assert "# saquery SMIR: master sm1, standby sm2" in text, text
    assert sorted(n.name for n in drafted.nodes if "subnet_manager" in n.roles) == ["sm1", "sm2"]
    assert 'ofed: {flavor: doca, version: "2.9.1"}' in text, text  # from ofed_info -s
    assert 'driver: {version: "550.90.07"}  # installed: driver: 550.90.07 on gpu[01-03]' in text, text
    assert 'nccl: "2.21.5"  # installed' in text and 'cuda: "12.4.1"  # installed' in text, text
    assert not load_spec(draft).errors


def test_an_unknown_host_key_is_never_accepted(lab: tuple[Path, dict[str, str], dict[str, object]]) -> None:
    work, env, overlay = lab
    ssh = overlay["ssh"]
    addresses: dict[str, str] = overlay["addresses"]  # type: ignore[assignment]
    assert isinstance(ssh, dict)
    empty = work / "empty_known_hosts"
    empty.write_text("")
    done = _cli("discover", ",".join(sorted(addresses.values())), "--user", ssh["user"], "--key", ssh["key"],
                "--known-hosts", str(empty), env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("is not in") >= 1, done.stderr  # each refused key named (the summary is cut short)
    assert empty.read_text() == ""  # nothing learnt
