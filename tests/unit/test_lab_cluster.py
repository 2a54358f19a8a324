"""cluster: the pure parts of bring-up (addresses, known_hosts, overlay, podman run arguments)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from provisioner.errors import LabError
from provisioner.lab import cluster
from provisioner.lab.names import container_name


def test_allocate_keeps_existing_and_skips_used() -> None:
    got = cluster.allocate_addresses(["a", "b", "c"], {"b": "10.213.38.40"}, {"10.213.38.10"})
    assert got == {"a": "10.213.38.11", "b": "10.213.38.40", "c": "10.213.38.12"}


def test_allocate_gives_the_spec_address_when_free() -> None:
    """A lab of gpu01, gpu02, sm1, sm2 from a spec whose gpu03 has .13: lowest-free would hand sm1 .13 and the
    overlay would clash with the spec's gpu03 (SPEC-DUP-ADDRESS); the spec's own addresses keep it valid."""
    spec = {"gpu01": "10.213.38.11", "gpu02": "10.213.38.12", "sm1": "10.213.38.21", "sm2": "10.213.38.22"}
    got = cluster.allocate_addresses(["gpu01", "gpu02", "sm1", "sm2"], {}, set(), preferred=spec)
    assert got == spec
    # taken by another lab, off the lab network, or not an address: the lowest free one instead
    odd = {**spec, "gpu02": "10.0.0.12", "sm1": "10.213.38.11", "sm2": "nope"}
    got = cluster.allocate_addresses(["gpu01", "gpu02", "sm1", "sm2"], {}, {"10.213.38.11"}, preferred=odd)
    assert got == {"gpu01": "10.213.38.10", "gpu02": "10.213.38.12", "sm1": "10.213.38.13", "sm2": "10.213.38.14"}


def test_allocate_runs_out() -> None:
    with pytest.raises(LabError, match="no free address"):
        cluster.allocate_addresses(["a", "b"], {}, set(), subnet="10.0.0.0/29")


def test_known_hosts_roundtrip() -> None:
    entries = {"gpu01": ("10.213.38.10", "ssh-ed25519 AAAAkey1 root@gpu01")}
    text = cluster.known_hosts_text(entries)
    assert text == "gpu01,10.213.38.10 ssh-ed25519 AAAAkey1\n"
    assert cluster.parse_known_hosts(text) == {"gpu01": ("10.213.38.10", "ssh-ed25519 AAAAkey1")}


def test_overlay_shape() -> None:
    data = cluster.overlay_data(Path("/k"), Path("/kh"), {"b": "2", "a": "1"})
    assert data == {"ssh": {"user": "root", "key": "/k", "known_hosts": "/kh"}, "addresses": {"a": "1", "b": "2"},
                    "site_vars": {"preflight_gpu_evidence": "nvidia-smi",
                                  # the lab kernel has no NFS client, no nfsd and no Lustre
                                  "nfs_client_require_kernel_nfs": False,
                                  "nfs_server_require_kernel_nfsd": False,
                                  "lustre_client_require_kernel_support": False,
                                  "nfs_client_userspace_tools": True,
                                  "nfs_server_ganesha_graceless": True,
                                  "nccl_tests_build_from_source": False,
                                  # the lab's IPoIB links are veth pairs (provisioner/lab/ipoib.py)
                                  "ipoib_require_infiniband": False,
                                  "perftest_cuda_build_from_source": False,
                                  "slurm_proctrack_type": "proctrack/linuxproc", "slurm_task_plugin": "task/none",
                                  "slurm_node_options": "CPUs=2"}}


def test_overlay_site_vars_are_role_variables_the_spec_accepts() -> None:
    """Every lab site_var names a variable some role declares, and the spec loader takes the overlay."""
    import yaml

    from provisioner.spec.load import load_text

    root = Path(__file__).resolve().parents[2]
    declared = "".join(p.read_text(encoding="utf-8") for p in (root / "roles").glob("*/meta/argument_specs.yml"))
    for name in cluster.LAB_SITE_VARS:
        assert f"      {name}:\n" in declared, name
    overlay = yaml.safe_load(yaml.safe_dump(cluster.overlay_data(Path("/k"), Path("/kh"), {})))
    res = load_text((root / "examples" / "lab" / "cluster.yaml").read_text(encoding="utf-8"), "cluster.yaml", overlay)
    assert res.cluster is not None, res.diagnostics
    assert res.cluster.spec.site_vars["nfs_client_require_kernel_nfs"] is False


def test_run_args_mounts_state_and_sysfs() -> None:
    args = cluster.run_args("c1", "gpu01", "10.213.38.10", Path("/lab/c1"))
    assert "--systemd=always" in args and args[-1] == "/sbin/init"
    assert "/lab/c1:/run/lab:rw" in args
    assert "/lab/c1/nodes/gpu01/sys/class:/sys/class:ro" in args
    assert args[args.index("--ip") + 1] == "10.213.38.10"
    assert args[args.index("--name") + 1] == "plab-c1-gpu01"


def test_run_args_give_nfs_servers_an_exportable_tmpfs() -> None:
    plain = cluster.run_args("c1", "gpu01", "10.213.38.10", Path("/lab/c1"))
    assert "--cap-add=DAC_READ_SEARCH" not in plain and "--tmpfs" not in plain
    args = cluster.run_args("c1", "sm1", "10.213.38.11", Path("/lab/c1"),
                            exports=["/export/shared", "/export/home", "/export/shared"])
    assert args.count("--cap-add=DAC_READ_SEARCH") == 1
    tmpfs = [args[i + 1] for i, a in enumerate(args) if a == "--tmpfs"]
    assert tmpfs == ["/export/shared:rw,mode=0755", "/export/home:rw,mode=0755"]
    assert args.index("--tmpfs") < args.index(cluster.image.IMAGE)  # options before the image name
    assert args[-2:] == [cluster.image.IMAGE, "/sbin/init"]


@pytest.mark.parametrize("path", ["relative", "/", "/export/../etc", "/export/./x", "/a:b", "/a,uid=0",
                                  "/a b", "/export//x", "/x;reboot"])
def test_run_args_refuse_export_paths_podman_would_misread(path: str) -> None:
    with pytest.raises(LabError, match="cannot be given to a lab container"):
        cluster.run_args("c1", "sm1", "10.213.38.11", Path("/lab/c1"), exports=[path])


def test_lab_nfs_exports_come_from_the_spec() -> None:
    from provisioner.lab.fromspec import lab_nfs_exports
    from provisioner.spec.load import load_cluster

    root = Path(__file__).resolve().parents[2]
    lab, _ = load_cluster(root / "examples" / "lab" / "cluster.yaml")
    assert lab_nfs_exports(lab) == {"sm1": ["/export/shared"]}  # sm2 has the nfs_server role but no export
    big, _ = load_cluster(root / "examples" / "h100-ndr-8node.yaml")
    assert lab_nfs_exports(big) == {"sm1": ["/export/home"]}


def test_names_are_validated() -> None:
    with pytest.raises(ValueError):
        container_name("c1", "gpu01; rm -rf /")


def test_ssh_key_is_private_and_reused(tmp_path: Path) -> None:
    pub = cluster.ensure_ssh_key(tmp_path / "ssh")
    assert pub.startswith("ssh-ed25519 ")
    assert (tmp_path / "ssh" / "id_ed25519").stat().st_mode & 0o777 == 0o600
    assert cluster.ensure_ssh_key(tmp_path / "ssh") == pub


def test_host_conf_text() -> None:
    from provisioner.lab.host import containers_conf_text, parse_dpkg_status

    text = containers_conf_text()
    assert 'runtime = "runc"' in text and "nofile=1024:1024" in text and 'cgroup_manager = "cgroupfs"' in text
    assert parse_dpkg_status("podman install ok installed\nrunc deinstall ok config-files\n") == {"podman"}


def test_cli_lab_up_gives_the_nfs_servers_their_exports(monkeypatch: pytest.MonkeyPatch) -> None:
    """`provision lab up` must pass the spec's export paths on, or Ganesha in the lab has nothing to export."""
    from provisioner.cli import main

    seen: dict[str, object] = {}

    def fake_lab_up(*args: object, **kwargs: object) -> None:
        seen.update(kwargs)
        raise LabError("stopped by the test after lab_up was called")

    monkeypatch.setattr(cluster, "lab_up", fake_lab_up)
    root = Path(__file__).resolve().parents[2]
    assert main(["lab", "up", str(root / "examples" / "lab" / "cluster.yaml")]) != 0
    assert seen["nfs_exports"] == {"sm1": ["/export/shared"]}


def _fake_podman_network(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """lab_up's podman side faked: one lab network whose addresses ``podman run`` refuses twice, as podman's IPAM
    does; ``_used_addresses`` waits (up to 1 s) for a second caller so that two unserialised bring-ups both read
    the network before either starts a container. Returns the network's ``{ip: container}``."""
    import threading

    from provisioner.lab import host

    monkeypatch.setenv("PROVISIONER_LAB_DIR", str(tmp_path / "lab"))
    monkeypatch.setattr(host, "HOST_LOCK", tmp_path / "host.lock", raising=False)
    for name in ("require_root", "ensure_host_packages", "ensure_containers_conf"):
        monkeypatch.setattr(cluster, name, lambda *_a, **_k: None)
    monkeypatch.setattr(cluster.image, "ensure_image", lambda *_a, **_k: "recipe")
    monkeypatch.setattr(cluster.network, "ensure_network", lambda *_a, **_k: False)
    monkeypatch.setattr(cluster.network, "flush_neighbours", lambda *_a, **_k: None)
    monkeypatch.setattr(cluster.network, "wait_for_ssh", lambda *_a, **_k: {})
    monkeypatch.setattr(cluster.ipoib, "ensure_networks", lambda *_a, **_k: [])
    monkeypatch.setattr(cluster, "_containers", lambda *_a, **_k: {})
    monkeypatch.setattr(cluster, "_prepare_node", lambda *_a, **_k: "ssh-ed25519 AAAAC3Nz fake")
    on_network: dict[str, str] = {}
    guard = threading.Lock()
    both_read = threading.Barrier(2)

    def used(_exclude: str) -> set[str]:
        with contextlib.suppress(threading.BrokenBarrierError):
            both_read.wait(timeout=1.0)
        with guard:
            return set(on_network)

    def start(name: str, host: str, ip: str, *_a: object, **_k: object) -> bool:
        with guard:
            if ip in on_network:
                raise LabError(f"podman run {container_name(name, host)}: IPAM error: requested ip address {ip} "
                               f"is already allocated to container {on_network[ip]}")
            on_network[ip] = container_name(name, host)
        return True

    monkeypatch.setattr(cluster, "_used_addresses", used)
    monkeypatch.setattr(cluster, "_start", start)
    return on_network


def test_two_labs_brought_up_at_once_get_distinct_addresses(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Two `lab up`s at once (parallel lab test workers, two engineers) share the one lab network: each picks its
    addresses from what is on the network and then starts its containers, so both must not pick before either
    starts, or the second's `podman run` fails on an address the first took."""
    import threading

    from provisioner.lab.hardware import LabNodeSpec

    on_network = _fake_podman_network(monkeypatch, tmp_path)
    errors: list[BaseException] = []
    results: dict[str, cluster.LabInfo] = {}

    def up(name: str) -> None:
        try:
            results[name] = cluster.lab_up(name, [LabNodeSpec(hostname=f"gpu0{i}") for i in (1, 2, 3)])
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=up, args=(name,)) for name in ("laba", "labb")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    assert len(on_network) == 6
    assert set(results["laba"].addresses.values()).isdisjoint(results["labb"].addresses.values())


def test_containers_conf_written_by_two_labs_at_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Two lab steps sharing a lab dir (parallel lab test workers) both write containers.conf when it is missing.
    With one temporary name for both, the first rename took the second's file away and the second failed with
    FileNotFoundError; here the second writer runs entirely inside the first one's rename."""
    from provisioner.lab import host

    real_replace = Path.replace
    renames: list[str] = []
    nested: list[Path] = []

    def replace(self: Path, target: Path) -> Path:
        renames.append(self.name)
        if len(renames) == 1:
            nested.append(host.ensure_containers_conf(tmp_path))
        return real_replace(self, target)

    monkeypatch.setattr(Path, "replace", replace)
    path = host.ensure_containers_conf(tmp_path)
    assert len(renames) == 2 and nested == [path]
    assert path.read_text(encoding="utf-8") != ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["containers.conf"]
