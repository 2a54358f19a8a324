"""`provision drift` over real SSH against a 2-node lab: a hand-installed NCCL on one node is named, then fixed.

No converge: the pinned packages are installed with apt from the lab's signed vendor repository (as
tests/lab/test_lab_stack.py does), and each node's manifest is written by the manifest role's own gatherer
(roles/manifest/files/manifest_gather.py, run by the node's /usr/bin/python3 with the role's default package
patterns and module regex, its JSON stored at /var/lib/provisioner/manifest.json as the role stores it). Then
`provision drift SPEC --overlay <lab overlay>` runs through ``provisioner.cli.main``, reading the manifests over
SSH with the lab's known_hosts (host keys verified, never auto-accepted):

1. both nodes at the pins -> exit 0, no finding;
2. gpu02 gets the repository's newer "drift" libnccl2 (2.23.4, what an unpinned `apt-get upgrade` would pull) ->
   exit 1, an error naming gpu02, item ``nccl``, expected 2.21.5 and the observed package version;
3. gpu02 back to the pinned libnccl2 -> exit 0 again.

The lab is torn down after the module, also after a failure. Slow on 2 shared cores (lab bring-up and two apt
installs: minutes). Run: ``PROVISIONER_LAB_DIR=/tmp/x-lab PROVISIONER_LAB_TEST_CLUSTER=x pytest -m lab
tests/lab/test_drift_lab.py`` (root, podman).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from _labspec import APT, APT_PINS, cluster_name  # type: ignore[import-not-found]

from provisioner import cli
from provisioner.lab.cluster import LabInfo, cluster_dir, lab_down, lab_up
from provisioner.lab.fromspec import lab_cables, lab_nodes, lab_switches, lab_versions
from provisioner.lab.host import ensure_containers_conf, podman
from provisioner.lab.names import container_name
from provisioner.spec import load_cluster

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("podman") is None, reason="needs root and podman"),
]

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "manifest"
CLUSTER = cluster_name("drift")
NODES = ("gpu01", "gpu02")
DRIFTED = "gpu02"
NCCL_PINNED, NCCL_DRIFT = "2.21.5-1+cuda12.4", "2.23.4-1+cuda12.4"

# Two GPU nodes of the bundled lab's shape (no NVSwitch, so no fabric manager to install); a switch-embedded SM
# keeps the lab at two containers.
SPEC = """\
cluster: {name: CLUSTER_NAME, os: debian-12}
ssh: {user: root, known_hosts: known_hosts}
software:
  driver: {version: "550.90.07", kernel_modules: open}
  cuda: "12.4.1"
  nccl: "2.21.5"
  ofed: {flavor: doca, version: "2.9.1"}
repositories:
  cuda: {url: http://mirror.lab.invalid/cuda/debian12/x86_64, key: keys/cuda.gpg, components: []}
  doca: {url: http://mirror.lab.invalid/doca/2.9.1/debian12/x86_64, key: keys/doca.gpg, components: []}
profiles:
  gpu2:
    gpu: {model: H100-SXM5-80GB, count: 2, nvswitch: false}
    hcas: [{device: "mlx5_[0-1]", rate: NDR}]
nodes:
  - {name: "gpu[01-02]", address: "10.213.38.[11-12]", profile: gpu2}
switches:
  - {name: "leaf[1-2]", tier: leaf, ports: 64, uplinks: 8}
  - {name: spine1, tier: spine, ports: 64}
fabric:
  rate: NDR
  topology:
    kind: rail_optimized
    cabling:
      - {nodes: "gpu[01-02]", hca: mlx5_0, switch: leaf1, ports: 1-2}
      - {nodes: "gpu[01-02]", hca: mlx5_1, switch: leaf2, ports: 1-2}
  subnet_manager: {kind: switch, switch: leaf1}
""".replace("CLUSTER_NAME", CLUSTER)

# The same apt pinning the gpu_stack role writes: the pinned releases win over the repository's drift set.
PINS = APT_PINS
PACKAGES = "nvidia-driver-550-open cuda-toolkit-12-4 libnccl2 nccl-tests doca-ofed"
GATHER_ON_NODE = "/tmp/manifest_gather.py"


@dataclass(frozen=True)
class Lab:
    info: LabInfo
    spec: Path
    state: Path


def sh(host: str, command: str, timeout: float = 300) -> str:
    """Run ``command`` in ``host``'s container (the trusted local channel, not SSH); it must succeed."""
    done = podman("exec", container_name(CLUSTER, host), "sh", "-c", command, check=False, timeout=timeout)
    assert done.returncode == 0, f"{host}: {command}\n{done.stdout}\n{done.stderr}"
    return str(done.stdout)


def install_pinned(host: str) -> None:
    sh(host, "install -D -m 0644 /run/lab/keys/lab-vendor.gpg /etc/apt/keyrings/lab-vendor.gpg && "
             "echo 'deb [signed-by=/etc/apt/keyrings/lab-vendor.gpg] file:/run/lab/vendor-repo bookworm main'"
             " > /etc/apt/sources.list.d/lab-vendor.list && "
             f"printf '%s' {shlex.quote(PINS)} > /etc/apt/preferences.d/lab-pins && "
             f"{APT} update && {APT} install -y --no-install-recommends {PACKAGES}")


def write_manifest(host: str) -> dict[str, Any]:
    """Run the role's gatherer as the role does (its default patterns and module regex) and store its JSON
    where the role stores it (sorted keys, 2-space indent). Returns the manifest as written."""
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    args = ["--module-regex", defaults["manifest_module_regex"], *defaults["manifest_packages"]]
    path = defaults["manifest_path"]
    sh(host, f"mkdir -p {shlex.quote(str(Path(path).parent))} && {defaults['manifest_python']} {GATHER_ON_NODE} "
             f"{shlex.join(args)} | {defaults['manifest_python']} -c "
             "'import json,sys; print(json.dumps(json.load(sys.stdin), indent=2, sort_keys=True))' "
             f"> {shlex.quote(path)}.new && mv {shlex.quote(path)}.new {shlex.quote(path)}")
    manifest: dict[str, Any] = json.loads(sh(host, f"cat {shlex.quote(path)}"))
    return manifest


def drift(lab: Lab, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, dict[str, Any]]:
    """`provision drift` through the CLI entry point: exit code, what it printed, the report it saved."""
    capsys.readouterr()
    rc = cli.main(["drift", str(lab.spec), "--overlay", str(lab.info.overlay), "--out", str(lab.state)])
    printed = capsys.readouterr().out
    report = json.loads((lab.state / "drift" / "latest.json").read_text())
    return rc, printed, report


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    os.environ.setdefault("PROVISIONER_LAB_DIR", str(tmp_path_factory.mktemp("labdir")))
    ensure_containers_conf()
    d = tmp_path_factory.mktemp("drift")
    spec = d / "cluster.yaml"
    spec.write_text(SPEC)
    cluster, _ = load_cluster(spec)

    def teardown() -> None:
        lab_down(CLUSTER)
        left = podman("ps", "-a", "--filter", f"label=provisioner-lab.cluster={CLUSTER}", "--format",
                      "{{.Names}}", check=False).stdout.split()
        assert left == [] and not cluster_dir(CLUSTER).exists()

    request.addfinalizer(teardown)  # runs after a failed bring-up too
    info = lab_up(CLUSTER, lab_nodes(cluster), lab_switches(cluster), lab_cables(cluster),
                  versions=lab_versions(cluster))
    with ThreadPoolExecutor(max_workers=len(NODES)) as pool:
        list(pool.map(install_pinned, NODES))
    for host in NODES:
        podman("cp", str(ROLE / "files" / "manifest_gather.py"), f"{container_name(CLUSTER, host)}:{GATHER_ON_NODE}")
    yield Lab(info, spec, d / "state")


def test_drift_names_the_node_with_a_hand_installed_nccl_then_clears(
        lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    for host in NODES:
        assert write_manifest(host)["packages"]["libnccl2"] == NCCL_PINNED
    rc, printed, report = drift(lab, capsys)
    assert (rc, report["findings"], report["missing"]) == (0, [], {}), printed
    assert sorted(report["nodes"]) == list(NODES)

    # what `apt-get install libnccl2` without the role's pin does on one node
    sh(DRIFTED, f"{APT} install -y --no-install-recommends libnccl2={NCCL_DRIFT}")
    assert write_manifest(DRIFTED)["packages"]["libnccl2"] == NCCL_DRIFT
    rc, printed, report = drift(lab, capsys)
    assert rc == 1, printed
    spec_errors = [f for f in report["findings"] if f["kind"] == "spec"]
    nccl = [f for f in spec_errors if f["item"] == "nccl"]
    assert nccl == [{"kind": "spec", "severity": "error", "node": DRIFTED, "item": "nccl", "expected": "2.21.5",
                     "observed": NCCL_DRIFT, "message": f"nccl on {DRIFTED} is {NCCL_DRIFT}, the spec pins 2.21.5"}]
    assert {f["node"] for f in spec_errors} == {DRIFTED}, spec_errors  # gpu01 is at every pin
    assert f"ERROR   {DRIFTED} nccl: nccl on {DRIFTED} is {NCCL_DRIFT}, the spec pins 2.21.5" in printed
    # two peers that disagree: no majority, so both are named with what they run (the spec finding is what says
    # which one is off)
    peer = sorted((f["node"], f["expected"], f["observed"]) for f in report["findings"]
                  if f["kind"] == "peers" and f["item"] == "package:libnccl2")
    assert peer == [("gpu01", None, NCCL_PINNED), (DRIFTED, None, NCCL_DRIFT)]

    sh(DRIFTED, f"{APT} install -y --no-install-recommends --allow-downgrades libnccl2={NCCL_PINNED} nccl-tests")
    assert write_manifest(DRIFTED)["packages"]["libnccl2"] == NCCL_PINNED
    rc, printed, report = drift(lab, capsys)
    assert (rc, report["findings"], report["missing"]) == (0, [], {}), printed
