"""The lab's vendor repository from the spec's pins, and the overlay that points the spec at it."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest
import yaml

from provisioner.lab import cluster
from provisioner.lab.fromspec import drift_versions, lab_versions
from provisioner.lab.packages import VendorVersions
from provisioner.spec.load import load_cluster, load_spec, load_text

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lab" / "cluster.yaml"


def test_lab_versions_follow_the_spec_pins() -> None:
    spec, _ = load_cluster(EXAMPLE)
    v = lab_versions(spec)
    assert (v.driver, v.driver_flavor, v.cuda, v.nccl) == ("550.90.07", "open", "12.4.1", "2.21.5")
    assert (v.ofed_kind, v.doca, v.ofed) == ("doca", "2.9.1", "24.10-1.1.4.0")
    assert v.fabric_manager is True  # the GPU nodes have NVSwitch
    assert v.dcgm == "3.3.9"  # datacenter-gpu-manager 1:3.3.9 for the dcgm role
    pinned = load_text(EXAMPLE.read_text().replace('dcgm: "3.3.9"', 'dcgm: "3.3.8"'), "dcgm.yaml").cluster
    assert pinned is not None and lab_versions(pinned).dcgm == "3.3.8"


def test_lab_versions_mlnx_ofed_and_proprietary() -> None:
    text = EXAMPLE.read_text().replace("ofed: {flavor: doca, version: \"2.9.1\"}",
                                       "ofed: {flavor: mlnx_ofed, version: \"23.10-3.2.2.0\"}")
    text = text.replace("kernel_modules: open", "kernel_modules: proprietary")
    result = load_text(text, "mlnx.yaml")
    assert result.cluster is not None, result.diagnostics
    v = lab_versions(result.cluster)
    assert (v.ofed_kind, v.ofed, v.driver_flavor) == ("mlnx", "23.10-3.2.2.0", "proprietary")


def test_drift_is_newer_in_the_same_branch() -> None:
    pinned = VendorVersions(driver="550.90.07", nccl="2.21.5")
    drift = drift_versions(pinned)
    assert (drift.driver, drift.nccl) == ("550.127.05", "2.23.4")
    assert drift_versions(VendorVersions(driver="570.86.10", nccl="2.25.1")).driver == "570.86.11"
    assert drift.cuda == pinned.cuda and drift.driver_branch == pinned.driver_branch


@pytest.mark.skipif(shutil.which("gpg") is None or shutil.which("dpkg-deb") is None, reason="needs gpg and dpkg")
def test_vendor_repo_is_built_with_the_key_outside_the_node_mount(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROVISIONER_LAB_DIR", str(tmp_path / "labdir"))
    state_dir = cluster.cluster_dir("vtest")
    state_dir.mkdir(parents=True)
    keyring = cluster.ensure_vendor_repo("vtest", state_dir, VendorVersions())
    # The overlay's key is armored under a .pub name, as NVIDIA serves its keys; the binary twin sits beside it.
    assert keyring == state_dir / "keys" / "lab-vendor.pub"
    assert keyring.read_bytes().startswith(b"-----BEGIN PGP PUBLIC KEY BLOCK-----")
    assert (state_dir / "keys" / "lab-vendor.gpg").read_bytes()[:1] == b"\x98"  # old-format public-key packet
    gnupg = cluster.vendor_gnupg_home("vtest")
    assert gnupg.is_dir() and state_dir not in gnupg.parents  # the secret key never reaches /run/lab
    assert not [p for p in state_dir.rglob("*") if p.name in ("private-keys-v1.d", "pubring.kbx")]
    index = gzip.decompress((state_dir / "vendor-repo/dists/bookworm/main/binary-amd64/Packages.gz").read_bytes())
    versions = {(s.split("\nVersion: ")[0].removeprefix("Package: "), s.split("\nVersion: ")[1].split("\n")[0])
                for s in index.decode().split("\n\n") if s.startswith("Package: ")}
    assert ("nvidia-utils-550", "550.90.07-0ubuntu1") in versions  # pinned
    assert ("nvidia-utils-550", "550.127.05-0ubuntu1") in versions  # drift
    assert ("libnccl2", "2.23.4-1+cuda12.4") in versions
    assert "infiniband-diags" not in {name for name, _ in versions}  # Debian's real one serves
    assert cluster.ensure_vendor_repo("vtest", state_dir, VendorVersions()) == keyring  # idempotent


def test_overlay_replaces_the_spec_mirrors_and_validates(tmp_path: Path) -> None:
    keyring = tmp_path / "keys" / "lab-vendor.gpg"
    data = cluster.overlay_data(tmp_path / "id", tmp_path / "kh", {"gpu01": "10.213.38.10"}, keyring)
    repo = {"url": "file:///run/lab/vendor-repo", "key": str(keyring), "suite": "bookworm", "components": ["main"]}
    assert data["repositories"] == {"offline": True, "cuda": repo, "doca": repo}
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(yaml.safe_dump(data))
    result = load_spec(EXAMPLE, overlay)
    assert result.cluster is not None and not result.errors, result.diagnostics
    repos = result.cluster.spec.repositories
    assert repos.cuda is not None and repos.doca is not None
    assert (repos.cuda.url, repos.cuda.components, repos.cuda.suite) == ("file:///run/lab/vendor-repo", ["main"],
                                                                       "bookworm")
    assert repos.doca.key == str(keyring)
    assert next(n for n in result.cluster.nodes if n.name == "gpu01").address == "10.213.38.10"
