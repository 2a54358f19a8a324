"""The lab's vendor repository: real .debs, a signed index, and apt itself as the judge."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from provisioner.errors import LabError
from provisioner.lab.image import lab_files
from provisioner.lab.packages import VendorVersions, recipes_for
from provisioner.lab.vendor_repo import (
    KEYRING_NAME,
    RepoInfo,
    build_vendor_repo,
    collect_recipes,
    ensure_signing_key,
    export_keyring,
)

pytestmark = pytest.mark.skipif(
    not (shutil.which("dpkg-deb") and shutil.which("gpg") and shutil.which("apt-get")),
    reason="needs dpkg-deb, gpg and apt-get",
)

PINNED = VendorVersions()
DRIFT = replace(PINNED, driver="550.127.05", nccl="2.23.4")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> RepoInfo:
    base = tmp_path_factory.mktemp("vendor")
    return build_vendor_repo(base / "repo", [PINNED, DRIFT])


def _apt(repo: RepoInfo, tmp: Path, keyring: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run apt on the host against only this repo, touching none of the host's apt state."""
    (tmp / "state" / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (tmp / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    (tmp / "status").touch()
    sources = tmp / "sources.list"
    sources.write_text(f"deb [signed-by={keyring}] {repo.url_for_file_repo} bookworm main\n")
    prefs = tmp / "preferences"
    prefs.write_text("Package: libnccl2\nPin: version 2.21.5-1+cuda12.4\nPin-Priority: 1001\n")
    opts = [
        f"-oDir::Etc::sourcelist={sources}",
        "-oDir::Etc::sourceparts=-",
        f"-oDir::State={tmp / 'state'}",
        f"-oDir::State::status={tmp / 'status'}",
        f"-oDir::Cache={tmp / 'cache'}",
        f"-oDir::Etc::preferences={prefs}",
        "-oDir::Etc::preferencesparts=-",
        "-oAPT::Sandbox::User=root",
        "-oDebug::NoLocking=1",
    ]
    tool = args[0]
    return subprocess.run([tool, *opts, *args[1:]], capture_output=True, text=True, cwd=tmp, check=False)


def test_layout_and_signatures_exist(repo: RepoInfo) -> None:
    for suite in ("bookworm", "jammy", "noble"):
        dist = repo.path / "dists" / suite
        assert (dist / "InRelease").read_text().startswith("-----BEGIN PGP SIGNED MESSAGE-----")
        assert "BEGIN PGP SIGNATURE" in (dist / "Release.gpg").read_text()
        assert (dist / "main" / "binary-amd64" / "Packages.gz").is_file()
    assert repo.keyring_path == repo.path / KEYRING_NAME
    assert repo.keyring_path.read_bytes()[:1] != b"-"  # binary keyring, not armored
    assert repo.armored_key_path.read_bytes().startswith(b"-----BEGIN PGP PUBLIC KEY BLOCK-----\n")
    # The secret key lives outside the (bind-mounted) repository.
    assert not list(repo.path.rglob("private-keys-v1.d"))


def test_apt_accepts_signature_and_sees_pinned_and_drift(repo: RepoInfo, tmp_path: Path) -> None:
    update = _apt(repo, tmp_path, repo.keyring_path, "apt-get", "update")
    assert update.returncode == 0, update.stdout + update.stderr
    assert "NO_PUBKEY" not in update.stderr
    policy = _apt(repo, tmp_path, repo.keyring_path, "apt-cache", "policy", "libnccl2", "nvidia-driver-550-open")
    assert "2.21.5-1+cuda12.4" in policy.stdout and "2.23.4-1+cuda12.4" in policy.stdout
    # The pin wins over the newer drift version.
    assert "Candidate: 2.21.5-1+cuda12.4" in policy.stdout
    assert "550.127.05-0ubuntu1" in policy.stdout and "550.90.07-0ubuntu1" in policy.stdout
    fetched = _apt(repo, tmp_path, repo.keyring_path, "apt-get", "download", "nvidia-utils-550=550.90.07-0ubuntu1")
    assert fetched.returncode == 0, fetched.stderr
    deb = tmp_path / "nvidia-utils-550_550.90.07-0ubuntu1_amd64.deb"
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout
    assert "./usr/bin/nvidia-smi" in listing and "root/root" in listing


def test_apt_rejects_a_wrong_key(repo: RepoInfo, tmp_path: Path) -> None:
    other_home = tmp_path / "other.gnupg"
    fpr = ensure_signing_key(other_home)
    wrong = tmp_path / "wrong.gpg"
    export_keyring(other_home, fpr, wrong)
    subprocess.run(["gpgconf", "--kill", "gpg-agent"], env={"GNUPGHOME": str(other_home)}, check=False)
    update = _apt(repo, tmp_path, wrong, "apt-get", "update")
    assert "NO_PUBKEY" in update.stdout + update.stderr
    policy = _apt(repo, tmp_path, wrong, "apt-cache", "policy", "libnccl2")
    assert "2.21.5" not in policy.stdout


def _extract(repo: RepoInfo, name: str, version: str, dest: Path) -> Path:
    deb = next(repo.path.glob(f"pool/main/*/{name}/{name}_{version}_amd64.deb"))
    subprocess.run(["dpkg-deb", "-x", str(deb), str(dest)], check=True)
    return dest


def test_packages_install_real_files(repo: RepoInfo, tmp_path: Path) -> None:
    root = _extract(repo, "cuda-toolkit-12-4", "12.4.1-1", tmp_path / "cuda")
    manifest = json.loads((root / "usr/local/cuda-12.4/version.json").read_text())
    assert manifest["cuda"] == {"name": "CUDA SDK", "version": "12.4.1"}
    root = _extract(repo, "libnccl2", "2.21.5-1+cuda12.4", tmp_path / "nccl")
    lib = root / "usr/lib/x86_64-linux-gnu"
    assert (lib / "libnccl.so.2.21.5").is_file() and (lib / "libnccl.so.2").readlink() == Path("libnccl.so.2.21.5")
    root = _extract(repo, "nvidia-dkms-550-open", "550.90.07-0ubuntu1", tmp_path / "dkms")
    conf = (root / "usr/src/nvidia-550.90.07/dkms.conf").read_text()
    assert 'PACKAGE_NAME="nvidia"' in conf and 'PACKAGE_VERSION="550.90.07"' in conf
    assert {'BUILT_MODULE_NAME[0]="nvidia"', 'BUILT_MODULE_NAME[4]="nvidia_peermem"'} <= set(conf.splitlines())
    driver = json.loads((root / "usr/lib/provisioner-lab/nvidia-driver.version").read_text())
    assert driver == {"version": "550.90.07", "cuda": "12.4", "flavor": "open"}


def test_dkms_packages_build_through_dkms_for_the_running_kernel(repo: RepoInfo, tmp_path: Path) -> None:
    deb = next(repo.path.glob("pool/main/n/nvidia-dkms-550-open/*550.90.07*.deb"))
    ctrl = tmp_path / "ctrl"
    subprocess.run(["dpkg-deb", "-e", str(deb), str(ctrl)], check=True)
    script = (ctrl / "postinst").read_text()
    assert "dkms add -m nvidia -v 550.90.07" in script and '/lib/modules/$KERNEL/build/include' in script
    assert 'dkms install -m nvidia -v 550.90.07 -k "$KERNEL"' in script
    assert "was skipped since the" in script  # dkms_common.postinst's words when the headers are missing
    assert "dkms remove -m nvidia -v 550.90.07 --all" in (ctrl / "prerm").read_text()


def test_rebuild_is_skipped_when_inputs_unchanged(tmp_path: Path) -> None:
    messages: list[str] = []
    first = build_vendor_repo(tmp_path / "repo", PINNED)
    stamp = (first.path / "dists/bookworm/InRelease").stat().st_mtime_ns
    again = build_vendor_repo(tmp_path / "repo", PINNED, messages.append)
    assert any("up to date" in m for m in messages)
    assert (again.path / "dists/bookworm/InRelease").stat().st_mtime_ns == stamp
    changed = build_vendor_repo(tmp_path / "repo", replace(PINNED, nccl="2.23.4"))
    assert ("libnccl2", "2.23.4-1+cuda12.4") in changed.packages
    assert "2.23.4-1+cuda12.4" in (changed.path / "dists/bookworm/main/binary-amd64/Packages").read_text()


def test_real_package_names_and_versions() -> None:
    keys = {r.key for r in recipes_for(PINNED)}
    assert ("nvidia-driver-550-open", "550.90.07-0ubuntu1") in keys
    assert ("cuda-drivers-550", "550.90.07-1") in keys
    assert ("nvidia-fabricmanager-550", "550.90.07-1") in keys
    assert ("cuda-toolkit-12-4", "12.4.1-1") in keys
    assert ("libnccl2", "2.21.5-1+cuda12.4") in keys and ("libnccl-dev", "2.21.5-1+cuda12.4") in keys
    assert "doca-ofed" in {name for name, _ in keys}
    mlnx = {r.name for r in recipes_for(replace(PINNED, ofed_kind="mlnx", ofed="23.10-2.1.3.1"))}
    assert {"mlnx-ofed-basic", "mlnx-ofed-all"} <= mlnx and "doca-ofed" not in mlnx
    closed = {r.name for r in recipes_for(replace(PINNED, driver_flavor="proprietary"))}
    assert "nvidia-driver-550" in closed and "nvidia-dkms-550" in closed


def test_dcgm_is_packaged_like_the_cuda_repository_and_only_there(repo: RepoInfo, tmp_path: Path) -> None:
    """datacenter-gpu-manager 1:<dcgm> (epoch 1) carries dcgmi, nv-hostengine and the nvidia-dcgm unit; the image no
    longer puts dcgmi on every node, so only a node the dcgm role converged has it."""
    assert ("datacenter-gpu-manager", "1:3.3.9") in {r.key for r in recipes_for(PINNED)}
    assert ("datacenter-gpu-manager", "1:3.3.8") in {r.key for r in recipes_for(replace(PINNED, dcgm="3.3.8"))}
    root = _extract(repo, "datacenter-gpu-manager", "1%3a3.3.9", tmp_path / "dcgm")
    assert (root / "usr/bin/dcgmi").is_file() and (root / "usr/bin/nv-hostengine").is_file()
    unit = (root / "usr/lib/systemd/system/nvidia-dcgm.service").read_text()
    assert "ExecStart=/usr/bin/nv-hostengine -n --service-account nvidia-dcgm\n" in unit
    assert json.loads((root / "usr/lib/provisioner-lab/dcgm.version").read_text()) == {"version": "3.3.9"}
    assert not [path for path in lab_files() if path.endswith("/dcgmi")]


def test_conflicting_duplicates_are_refused() -> None:
    with pytest.raises(LabError, match="different contents"):
        collect_recipes([PINNED, replace(PINNED, driver_flavor="proprietary", ofed_kind="mlnx")])
    with pytest.raises(LabError):
        collect_recipes([])


def _keyring_module():  # type: ignore[no-untyped-def]
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "roles/vendor_repos/library/apt_keyring.py"
    spec = importlib.util.spec_from_file_location("apt_keyring", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_apt_reads_signed_by_format_from_the_name_so_armored_keys_need_dearmoring(repo: RepoInfo,
                                                                                   tmp_path: Path) -> None:
    """The lab serves its key armored as lab-vendor.pub, like NVIDIA's 3bf863cc.pub. Copied under a
    .gpg name (what vendor_repos did for every key not named .asc) apt cannot use it; dearmored it can."""
    armored = repo.armored_key_path.read_bytes()
    as_gpg = tmp_path / "armored-named.gpg"
    as_gpg.write_bytes(armored)
    bad = _apt(repo, tmp_path, as_gpg, "apt-get", "update")
    # apt 2.6: "NO_PUBKEY <id>" then "E: The repository '...' is not signed.", exit 100.
    assert bad.returncode == 100 and "NO_PUBKEY" in bad.stderr and "is not signed" in bad.stderr, bad.stderr
    keyring, kind = _keyring_module().keyring_from(armored, "lab-vendor.pub")
    assert kind == "armored" and keyring == repo.keyring_path.read_bytes()  # what gpg --export writes
    dearmored = tmp_path / "dearmored.gpg"
    dearmored.write_bytes(keyring)
    shutil.rmtree(tmp_path / "state")
    good = _apt(repo, tmp_path, dearmored, "apt-get", "update")
    assert good.returncode == 0 and "NO_PUBKEY" not in good.stderr, good.stdout + good.stderr


def test_the_container_stack_is_there_only_when_asked_and_enroot_outside_the_index(tmp_path: Path) -> None:
    """nvidia-container-toolkit and its companions and the site-built pyxis in the apt index; enroot's .debs as
    its GitHub release publishes them, under their release names in a mirror directory and not in the index."""
    assert not [r for r in recipes_for(PINNED) if "enroot" in r.name]
    info = build_vendor_repo(tmp_path / "repo", replace(PINNED, containers=True))
    index = (info.path / "dists/bookworm/main/binary-amd64/Packages").read_text()
    names = {line.split(": ", 1)[1] for line in index.splitlines() if line.startswith("Package: ")}
    assert {"nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
            "libnvidia-container1", "nvslurm-plugin-pyxis"} <= names
    assert not {"enroot", "enroot+caps"} & names
    release = info.path / "github/NVIDIA/enroot/v3.5.0"
    assert sorted(p.name for p in release.iterdir()) == ["enroot+caps_3.5.0-1_amd64.deb", "enroot_3.5.0-1_amd64.deb"]
    root = tmp_path / "enroot"
    subprocess.run(["dpkg-deb", "-x", str(release / "enroot_3.5.0-1_amd64.deb"), str(root)], check=True)
    hook = root / "etc/enroot/hooks.d/98-nvidia.sh"
    assert hook.stat().st_mode & 0o111 and "nvidia-container-cli" in hook.read_text()
    assert (root / "etc/enroot/enroot.conf.d/README").is_file() and (root / "usr/lib/enroot/runtime.sh").is_file()
    done = subprocess.run([str(root / "usr/bin/enroot"), "version"], capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout) == (0, "3.5.0\n")
    caps = subprocess.run(["dpkg-deb", "--field", str(release / "enroot+caps_3.5.0-1_amd64.deb"), "Depends"],
                          capture_output=True, text=True, check=True)
    assert caps.stdout.strip() == "enroot (= 3.5.0-1)"
