"""Rendering: golden files, determinism, diff, and Ansible reading the result back."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from provisioner.render import build_inventory, render_files, render_inventory
from provisioner.spec import load_cluster

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
GOLDEN_SPECS = ["h100-ndr-8node.yaml", "a100-hdr-4node.yaml"]


def normalise(text: str) -> str:
    """Golden files must not depend on where the repository or the home directory is."""
    return text.replace(str(ROOT / "examples"), "__SPEC_DIR__").replace(os.path.expanduser("~"), "__HOME__")


@pytest.mark.parametrize("spec", GOLDEN_SPECS)
def test_golden_files(spec: str) -> None:
    cluster, _ = load_cluster(ROOT / "examples" / spec)
    files = {rel: normalise(text) for rel, text in render_files(cluster).items()}
    gdir = GOLDEN / spec.removesuffix(".yaml")
    if os.environ.get("PROVISIONER_UPDATE_GOLDEN") == "1":
        shutil.rmtree(gdir, ignore_errors=True)
        for rel, text in files.items():
            (gdir / rel).parent.mkdir(parents=True, exist_ok=True)
            (gdir / rel).write_text(text, encoding="utf-8")
    want = {str(p.relative_to(gdir)): p.read_text(encoding="utf-8") for p in sorted(gdir.rglob("*.yml"))}
    assert sorted(want) == sorted(files)
    for rel in want:
        assert files[rel] == want[rel], f"{rel} differs from the golden file (PROVISIONER_UPDATE_GOLDEN=1 to refresh)"


def test_golden_files_do_not_depend_on_the_checkout_path(tmp_path: Path) -> None:
    """The same spec from a directory of another length renders the same files (YAML folds long strings at a
    width, and where it folded depended on the spec directory inside them: a clone elsewhere failed the goldens)."""
    deep = tmp_path / ("d" * 90)
    shutil.copytree(ROOT / "examples", deep)
    cluster, _ = load_cluster(deep / "h100-ndr-8node.yaml")
    files = {rel: text.replace(str(deep), "__SPEC_DIR__").replace(os.path.expanduser("~"), "__HOME__")
             for rel, text in render_files(cluster).items()}
    gdir = GOLDEN / "h100-ndr-8node"
    for rel, text in files.items():
        assert text == (gdir / rel).read_text(encoding="utf-8"), rel


def test_render_is_deterministic_and_diffs(tmp_path: Path) -> None:
    cluster, _ = load_cluster(ROOT / "examples" / "h100-ndr-8node.yaml")
    first = render_inventory(cluster, tmp_path)
    snapshot = {p: p.read_bytes() for p in first.out_dir.rglob("*.yml")}
    assert len(first.written) == len(snapshot) == 14
    second = render_inventory(cluster, tmp_path)
    assert second.written == [] and second.removed == [] and second.diff == ""
    assert {p: p.read_bytes() for p in second.out_dir.rglob("*.yml")} == snapshot
    # a spec change shows as a diff and rewrites only what changed
    (first.out_dir / "host_vars" / "stale.yml").write_text("x: 1\n")
    spec2 = tmp_path / "c.yaml"
    spec2.write_text((ROOT / "examples" / "h100-ndr-8node.yaml").read_text().replace("priority: 14", "priority: 13"))
    (tmp_path / "keys").mkdir()
    cluster2, _ = load_cluster(spec2)
    third = render_inventory(cluster2, tmp_path)
    assert "host_vars/sm2.yml" in third.written and "host_vars/stale.yml" in third.removed
    assert "-opensm_priority: 14\n+opensm_priority: 13\n" in third.diff


def test_inventory_groups_and_vars() -> None:
    cluster, _ = load_cluster(ROOT / "examples" / "h100-ndr-8node.yaml")
    inv = build_inventory(cluster)
    assert inv.groups["compute"] == [f"gpu0{i}" for i in range(1, 9)]
    assert inv.groups["opensm"] == ["sm1", "sm2"]
    assert inv.groups["rail_7"] == [f"gpu0{i}" for i in range(1, 9)]
    assert inv.groups["leaf_rail0"] == [f"gpu0{i}" for i in range(1, 9)] + ["sm1", "sm2"]
    hv = inv.hostvars["gpu03"]
    pv = inv.groupvars["profile_hgx_h100"]
    assert pv["nccl_conf"]["NCCL_IB_HCA"] == "=" + ",".join(f"mlx5_{i}:1" for i in range(8))
    assert pv["nvidia_driver_fabric_manager"] is True and pv["nvidia_peermem_enabled"] is True
    assert inv.groupvars["profile_mgmt"]["nvidia_driver_enabled"] is False
    assert hv["nfs_client_mounts"][0]["transport"] == "rdma"
    assert "nfs_client_mounts" not in inv.hostvars["sm1"]  # empty lists are left to the role defaults
    assert inv.hostvars["sm1"]["opensm_priority"] == 15 and inv.hostvars["sm1"]["opensm_device"] == "mlx5_0"
    allv = inv.groupvars["all"]
    assert allv["opensm_routing_engines"] == ["ar_updn"]  # what the spec asks for, no updn fallback added
    assert allv["opensm_partitions"][0] == {"name": "training", "pkey": "0x0001", "membership": "full",
                                            "members": [f"gpu0{i}" for i in range(1, 9)], "ipoib": True}
    assert "StrictHostKeyChecking=yes" in allv["ansible_ssh_common_args"]


def test_no_routing_asked_leaves_the_sm_default() -> None:
    """Neither routing_engines nor adaptive_routing: no routing_engine is written (NVIDIA's opensm: ar_updn)."""
    cluster, _ = load_cluster(ROOT / "examples" / "h100-ndr-8node.yaml")
    sm = cluster.spec.fabric.subnet_manager
    assert sm is not None
    plain = sm.model_copy(update={"adaptive_routing": False, "routing_engines": None})
    fabric = cluster.spec.fabric.model_copy(update={"subnet_manager": plain})
    cluster = replace(cluster, spec=cluster.spec.model_copy(update={"fabric": fabric}))
    allv = build_inventory(cluster).groupvars["all"]
    assert allv["opensm_routing_engines"] == [] and allv["opensm_adaptive_routing"] is False
    chosen = sm.model_copy(update={"adaptive_routing": False, "routing_engines": ["ftree", "updn"]})
    fabric = cluster.spec.fabric.model_copy(update={"subnet_manager": chosen})
    cluster = replace(cluster, spec=cluster.spec.model_copy(update={"fabric": fabric}))
    assert build_inventory(cluster).groupvars["all"]["opensm_routing_engines"] == ["ftree", "updn"]


def test_ansible_reads_the_rendered_inventory(tmp_path: Path) -> None:
    import ansible_runner

    cluster, _ = load_cluster(ROOT / "examples" / "h100-ndr-8node.yaml")
    res = render_inventory(cluster, tmp_path)
    out, err = ansible_runner.get_inventory(action="list", inventories=[str(res.out_dir / "hosts.yml")],
                                            response_format="json", quiet=True)
    assert isinstance(out, dict), err
    assert sorted(out["compute"]["hosts"]) == [f"gpu0{i}" for i in range(1, 9)]
    assert out["_meta"]["hostvars"]["sm2"]["opensm_priority"] == 14
    # every string is written !unsafe (never templated); ansible-inventory's JSON says so
    assert out["_meta"]["hostvars"]["gpu01"]["ansible_host"] == {"__ansible_unsafe": "10.10.0.11"}
    assert out["_meta"]["hostvars"]["gpu01"]["preflight_gpu_count"] == 8  # from group_vars/profile_hgx_h100.yml


def test_inventory_plugin_reads_the_spec_through_its_config_file(tmp_path: Path) -> None:
    """`plugin: provisioner.cluster.spec` with `spec:` relative to the file: the groups and variables of `provision
    render`, every string tagged unsafe; a bare spec given to -i is refused with what to write instead."""
    import json
    import subprocess
    import sys

    spec = ROOT / "examples" / "h100-ndr-8node.yaml"
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "cluster.yaml").write_text(spec.read_text())
    config = tmp_path / "cluster.provisioner.yml"
    config.write_text("# AWX inventory source\nplugin: provisioner.cluster.spec\nspec: site/cluster.yaml\n")
    exe = Path(sys.executable).parent / "ansible-inventory"
    proc = subprocess.run([str(exe), "-i", str(config), "--list"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    rendered = build_inventory(load_cluster(spec)[0])
    assert sorted(data["compute"]["hosts"]) == rendered.groups["compute"]
    # values from the plugin come back tagged unsafe (never templated): compare their text
    profile_vars = rendered.groupvars["profile_hgx_h100"]
    assert unwrap(data["_meta"]["hostvars"]["gpu02"]["nccl_conf"]) == profile_vars["nccl_conf"]
    assert unwrap(data["_meta"]["hostvars"]["sm1"]["opensm_priority"]) == 15
    plain = [s for hv in data["_meta"]["hostvars"].values() for s in _plain_strings(hv)]
    assert plain == [], f"strings the plugin handed Ansible without the unsafe tag: {plain[:5]}"

    bare = subprocess.run([str(exe), "-i", str(spec), "--list"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert "is a cluster spec, not an inventory source: write a file such as cluster.provisioner.yml with " \
           "'plugin: provisioner.cluster.spec' and 'spec: h100-ndr-8node.yaml'" in bare.stderr, bare.stderr
    assert json.loads(bare.stdout)["_meta"]["hostvars"] == {}


def _plain_strings(value: object) -> list[str]:
    """Every string in an ansible-inventory JSON value that is not inside an {"__ansible_unsafe": ...} wrapper."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        if set(value) == {"__ansible_unsafe"}:
            return []
        return [s for k, v in value.items() for s in _plain_strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _plain_strings(v)]
    return []


def unwrap(value: object) -> object:
    if isinstance(value, dict):
        if set(value) == {"__ansible_unsafe"}:
            return value["__ansible_unsafe"]
        return {k: unwrap(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unwrap(v) for v in value]
    return value


def test_nccl_settings_follow_the_spec_and_nccl_rules(tmp_path: Path) -> None:
    from provisioner.lab.simtools import fabsim_nccl

    text = (ROOT / "examples" / "h100-ndr-8node.yaml").read_text()
    cluster, _ = load_cluster(ROOT / "examples" / "h100-ndr-8node.yaml")
    inv = build_inventory(cluster)
    conf = inv.groupvars["profile_hgx_h100"]["nccl_conf"]
    # NCCL strips one '=' for the whole list (net_ib.cc): every rail must survive NCCL's own filter
    assert conf["NCCL_IB_HCA"] == "=" + ",".join(f"mlx5_{i}:1" for i in range(8))
    node = {"hcas": [{"device": f"mlx5_{i}", "port": 1, "state": "active", "phys_state": "linkup"} for i in range(12)]}
    assert [h["device"] for h in fabsim_nccl.select_hcas(node, conf)] == [f"mlx5_{i}" for i in range(8)]
    assert "NCCL_NET_GDR_LEVEL" not in conf  # NVSwitch board: NCCL's own choice unless the spec asks
    # the compute partition: NCCL_IB_PKEY is an index the role finds on the node; render passes the key
    assert inv.hostvars["gpu03"]["nccl_ib_pkey"] == "0x8001" and "nccl_ib_pkey" not in inv.hostvars["sm1"]
    spec = tmp_path / "c.yaml"
    (tmp_path / "topo.xml").write_text("<system/>\n")
    spec.write_text(text.replace("    gpu: {model: H100-SXM5-80GB, count: 8, nvswitch: true}",
                                 "    gpu: {model: H100-SXM5-80GB, count: 8, nvswitch: true}\n"
                                 "    nccl_topology_file: topo.xml\n    nccl_net_gdr_level: PXB"))
    (tmp_path / "keys").mkdir()
    changed, _ = load_cluster(spec)
    pv = build_inventory(changed).groupvars["profile_hgx_h100"]
    assert pv["nccl_conf"]["NCCL_NET_GDR_LEVEL"] == "PXB"
    # one source of truth for the topology file: the role installs it and points NCCL_TOPO_FILE there
    assert "NCCL_TOPO_FILE" not in pv["nccl_conf"] and pv["nccl_topo_file"] == str(tmp_path / "topo.xml")


def test_gpudirect_mode_reaches_the_roles_and_nccl(tmp_path: Path) -> None:
    peer, _ = load_cluster(ROOT / "examples" / "h100-ndr-8node.yaml")
    inv = build_inventory(peer)
    pv, allv = inv.groupvars["profile_hgx_h100"], inv.groupvars["all"]
    assert allv["provisioner_gpudirect_mode"] == "peermem" and allv["perftest_cuda_version"] == "25.10.0-0.128"
    assert pv["perftest_cuda_enabled"] is True and inv.groupvars["profile_mgmt"]["perftest_cuda_enabled"] is False
    assert "NCCL_DMABUF_ENABLE" not in pv["nccl_conf"]
    spec = tmp_path / "c.yaml"
    spec.write_text((ROOT / "examples" / "h100-ndr-8node.yaml").read_text() + "gpudirect: {mode: dmabuf}\n")
    (tmp_path / "keys").mkdir()
    dmabuf, _ = load_cluster(spec)
    inv = build_inventory(dmabuf)
    assert inv.groupvars["all"]["provisioner_gpudirect_mode"] == "dmabuf"
    # DMA-BUF stays on (NCCL's default, said explicitly so a stale NCCL_DMABUF_ENABLE=0 in nccl.conf cannot linger)
    assert inv.groupvars["profile_hgx_h100"]["nccl_conf"]["NCCL_DMABUF_ENABLE"] == "1"
