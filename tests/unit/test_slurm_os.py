"""Slurm per OS (#25): the release each OS ships decides the cgroup plugin; validate names the two ways out where
cgroup v2 cannot work; the inventory carries cgroup.conf per release, the v1 boot parameters, topology.conf,
gres autodetection, slurmdbd and NHC."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.cli import main
from provisioner.render import build_inventory
from provisioner.spec import load_cluster, load_spec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "h100-ndr-8node.yaml"       # ubuntu-22.04
SLURM = """
slurm:
  controller: sm1
  partitions: [{name: gpu, nodes: "gpu[01-08]", default: true}]
"""
SITE_REPO = """  version: "23.11"
  repository: {url: "http://mirror.example.com/slurm", key: keys/slurm.gpg, suite: jammy}
"""


def _spec(tmp_path: Path, extra: str = "", *, os: str = "ubuntu-22.04") -> Path:
    spec = tmp_path / "c.yaml"
    text = EXAMPLE.read_text().replace("os: ubuntu-22.04", f"os: {os}")
    if os == "ubuntu-24.04":   # NVIDIA's noble repository starts at CUDA 12.5 (COMPAT-OS-CUDA)
        text = text.replace('"550.90.07"', '"555.42.06"').replace('cuda: "12.4.1"', 'cuda: "12.5.1"')
    spec.write_text(text + SLURM + extra)
    (tmp_path / "keys").mkdir(exist_ok=True)
    for key in ("slurm.gpg", "nhc.gpg"):
        (tmp_path / "keys" / key).write_bytes(b"\x99\x01")
    return spec


def _errors(spec: Path, rule: str) -> list[tuple[int, str]]:
    return [(d.line, d.message + " | " + d.hint) for d in load_spec(spec).errors if d.rule == rule]


def _allv(spec: Path) -> dict[str, object]:
    cluster, _ = load_cluster(spec)
    return build_inventory(cluster).groupvars["all"]


def test_ubuntu_2204_with_cgroup_v2_is_a_validate_error_naming_both_ways_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = _spec(tmp_path)
    errs = _errors(spec, "SLURM-CGROUP")
    line = EXAMPLE.read_text().count("\n") + 3   # the slurm section (its first line)
    assert [ln for ln, _ in errs] == [line]
    text = errs[0][1]
    assert "ubuntu-22.04 ships Slurm 21.08" in text and ">= 22.05" in text
    assert "slurm.repository" in text and "slurm.cgroup: v1" in text and "systemd.unified_cgroup_hierarchy=0" in text
    assert main(["validate", str(spec)]) == 1
    out = capsys.readouterr()
    assert f"c.yaml:{line}:" in out.out + out.err and "Traceback" not in out.out + out.err


@pytest.mark.parametrize("os", ["debian-12", "ubuntu-24.04"])
def test_an_os_whose_slurm_has_cgroup_v2_validates(tmp_path: Path, os: str) -> None:
    assert _errors(_spec(tmp_path, os=os), "SLURM-CGROUP") == []
    allv = _allv(_spec(tmp_path, os=os))
    assert allv["slurm_cgroup_conf"] == ["CgroupPlugin=cgroup/v2", "ConstrainCores=yes", "ConstrainDevices=yes",
                                         "ConstrainRAMSpace=yes"]
    assert allv["slurm_boot_parameters"] == []


def test_a_site_repository_with_a_newer_slurm_is_the_first_way_out(tmp_path: Path) -> None:
    spec = _spec(tmp_path, SITE_REPO)
    assert _errors(spec, "SLURM-CGROUP") == []
    allv = _allv(spec)
    assert allv["slurm_cgroup_conf"][0] == "CgroupPlugin=cgroup/v2"
    assert allv["slurm_min_version"] == "23.11"
    repo = allv["vendor_repos_slurm"]
    assert isinstance(repo, dict) and repo["url"] == "http://mirror.example.com/slurm" and repo["suite"] == "jammy"
    assert repo["key"] == str(tmp_path / "keys" / "slurm.gpg")


def test_cgroup_v1_is_the_second_way_out_with_its_boot_parameter(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "  cgroup: v1\n")
    assert _errors(spec, "SLURM-CGROUP") == []
    allv = _allv(spec)
    # 21.08 under v1: CgroupAutomount is still a setting there (gone from cgroup.conf(5) in 24.05)
    assert allv["slurm_cgroup_conf"][:2] == ["CgroupPlugin=cgroup/v1", "CgroupAutomount=yes"]
    assert allv["slurm_boot_parameters"] == ["systemd.unified_cgroup_hierarchy=0"]
    assert allv["slurm_min_version"] == "21.08"


def test_an_old_site_slurm_is_refused_too_and_the_version_needs_its_repository(tmp_path: Path) -> None:
    old = SITE_REPO.replace('"23.11"', '"21.08"')
    assert "the site repository's Slurm 21.08" in _errors(_spec(tmp_path, old), "SLURM-CGROUP")[0][1]
    errs = _errors(_spec(tmp_path, '  version: "23.11"\n'), "SLURM-CGROUP")
    assert len(errs) == 1 and "slurm.repository is missing" in errs[0][1]
    assert load_spec(_spec(tmp_path, '  version: "23.1"\n')).errors  # not a release (YY.MM)


# --- what the slurm role writes from those variables (its own templates, rendered as Ansible does) ---------------
NHC = """  nhc:
    repository: {url: "http://mirror.example.com/nhc", key: keys/nhc.gpg, components: [main]}
    interval: 600
    node_state: [ANY, CYCLE]
  accounting: {host: sm1}
"""


def _role_files(allv: dict[str, object], nvml: bool = True) -> dict[str, str]:
    import jinja2
    import yaml

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ROOT / "roles" / "slurm" / "templates"),
                             trim_blocks=True, undefined=jinja2.StrictUndefined)
    env.filters["bool"] = lambda v: v if isinstance(v, bool) else str(v).lower() in ("1", "true", "yes", "on")
    defaults = yaml.safe_load((ROOT / "roles" / "slurm" / "defaults" / "main.yml").read_text())
    values = {**defaults, **allv, "slurm_uses_cgroup": True, "slurm_gres_nvml": nvml,
              "slurm_cluster_name": "h100-ndr"}
    return {name: env.get_template(f"{name}.j2").render(**values)
            for name in ("slurm.conf", "cgroup.conf", "gres.conf")}


def _settings(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_cgroup_conf_per_os_and_release(tmp_path: Path) -> None:
    v1_2204 = _settings(_role_files(_allv(_spec(tmp_path, "  cgroup: v1\n")))["cgroup.conf"])
    assert v1_2204 == ["CgroupPlugin=cgroup/v1", "CgroupAutomount=yes", "ConstrainCores=yes", "ConstrainDevices=yes",
                       "ConstrainRAMSpace=yes"]
    v2_deb = _settings(_role_files(_allv(_spec(tmp_path, os="debian-12")))["cgroup.conf"])
    assert v2_deb == ["CgroupPlugin=cgroup/v2", "ConstrainCores=yes", "ConstrainDevices=yes", "ConstrainRAMSpace=yes"]
    # a 24.05 site Slurm under v1: no CgroupAutomount (gone from cgroup.conf(5) in 24.05)
    site = SITE_REPO.replace('"23.11"', '"24.05"') + "  cgroup: v1\n"
    assert "CgroupAutomount=yes" not in _role_files(_allv(_spec(tmp_path, site)))["cgroup.conf"]


def test_slurm_conf_has_the_topology_nhc_and_accounting_lines(tmp_path: Path) -> None:
    allv = _allv(_spec(tmp_path, NHC, os="debian-12"))
    files = _role_files(allv)
    conf = _settings(files["slurm.conf"])
    assert "TopologyPlugin=topology/tree" in conf
    health = [line for line in conf if line.startswith("HealthCheck")]
    assert health == ["HealthCheckProgram=/usr/sbin/nhc", "HealthCheckInterval=600", "HealthCheckNodeState=ANY,CYCLE"]
    acct = [line for line in conf if line.startswith(("Accounting", "JobAcctGather"))]
    assert acct == ["AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=10.10.0.2",
                    "JobAcctGatherType=jobacct_gather/cgroup"]
    # the role installs the topology.conf and nhc.conf that `provision export slurm|nhc` write
    cluster, _ = load_cluster(_spec(tmp_path, NHC, os="debian-12"))
    from provisioner.export.slurm import export_topology
    from provisioner.fabric.nhc import export_nhc
    assert allv["slurm_topology_conf"] == export_topology(cluster) and "SwitchName=rail0 Nodes=gpu[01-08]" in str(
        allv["slurm_topology_conf"])
    assert allv["slurm_nhc_conf"] == export_nhc(cluster)
    assert allv["slurm_nhc"] == {"package": "lbnl-nhc", "interval": 600, "node_state": ["ANY", "CYCLE"]}
    assert isinstance(allv["vendor_repos_nhc"], dict) and allv["vendor_repos_nhc"]["suite"] == "bookworm"


def test_without_the_options_slurm_conf_stays_as_it_was(tmp_path: Path) -> None:
    conf = _settings(_role_files(_allv(_spec(tmp_path, os="debian-12")))["slurm.conf"])
    assert "JobAcctGatherType=jobacct_gather/none" in conf
    assert not [line for line in conf if line.startswith(("HealthCheck", "Accounting"))]


def test_gres_conf_autodetects_through_nvml_only_where_slurm_has_the_plugin(tmp_path: Path) -> None:
    allv = _allv(_spec(tmp_path, os="debian-12"))
    assert _settings(_role_files(allv)["gres.conf"]) == [
        "AutoDetect=nvml"] + [f"NodeName=gpu0{i} Name=gpu File=/dev/nvidia[0-7]" for i in range(1, 9)]
    assert "AutoDetect" not in _role_files(allv, nvml=False)["gres.conf"]


def test_the_accounting_host_is_in_the_slurm_play_even_when_it_runs_neither_daemon(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "  accounting: {host: sm2}\n", os="debian-12")
    cluster, _ = load_cluster(spec)
    inv = build_inventory(cluster)
    assert inv.groups["slurm_accounting"] == ["sm2"] and "sm2" not in inv.groups["slurm_nodes"] + ["sm1"]
    play = (ROOT / "playbooks" / "slurm.yml").read_text()
    assert "hosts: slurm_controller:slurm_nodes:slurm_accounting" in play
    assert "inventory_hostname == slurm_accounting_host" in (ROOT / "roles/slurm/tasks/main.yml").read_text()


def test_an_accounting_host_that_is_no_node_is_a_validate_error(tmp_path: Path) -> None:
    errs = _errors(_spec(tmp_path, "  accounting: {host: db9}\n", os="debian-12"), "SLURM-ACCOUNTING")
    assert len(errs) == 1 and "'db9' is not defined" in errs[0][1]


def test_the_manifest_reads_the_booted_cgroup_hierarchy_from_mountinfo() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("manifest_gather",
                                                  ROOT / "roles" / "manifest" / "files" / "manifest_gather.py")
    assert spec is not None and spec.loader is not None
    gather = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gather)
    # proc(5) mountinfo lines: the unified hierarchy (systemd's default on every supported OS) ...
    v2 = "35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate\n"
    # ... and a hybrid one (this CI host's kernel: a tmpfs of v1 controllers, systemd's tree under unified/)
    hybrid = ("24 30 0:21 / /sys/fs/cgroup rw,nosuid,nodev,noexec shared:4 - tmpfs tmpfs rw,mode=755\n"
              "25 24 0:22 / /sys/fs/cgroup/unified rw,nosuid shared:5 - cgroup2 cgroup2 rw\n")
    assert gather.cgroup(v2) == "v2"
    assert gather.cgroup(hybrid) == "v1"
    assert gather.cgroup("22 1 0:5 / /proc rw - proc proc rw\n") is None
