"""Storage verification: parsers on real captured outputs, expected mounts from the spec, mount comparison,
round trip and dd throughput with a fake remote.

Fixtures (tests/fixtures/{proc-mounts,findmnt,dd}/) carry a ``# Source:`` header; :func:`_fixture` drops the
leading ``#`` lines (and findmnt's util-linux harness line ``rc=N``) before parsing. No public capture of a
kernel mount table with NFS/RDMA or Lustre entries was found, so the option-by-option comparisons below use
:class:`MountEntry` records built in the test, named as such, never presented as tool output.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.errors import ParseError
from provisioner.fabric import storage
from provisioner.fabric.storage import ExpectedMount, MountEntry
from provisioner.remote import Completed
from provisioner.spec.cluster import Cluster
from provisioner.spec.load import load_text
from tests.unit._storage_fakes import LAB_SPEC, NoKernelNfsRemote, lab_cluster

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
EXAMPLE = ROOT / "examples" / "h100-ndr-8node.yaml"


def _fixture(rel: str) -> str:
    lines = (FIXTURES / rel).read_text(encoding="utf-8").splitlines()
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    if lines and lines[-1].startswith("rc="):
        lines.pop()
    return "\n".join(lines) + "\n"


def _cluster(**storage_over: Any) -> Cluster:
    data = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    data["storage"].update(storage_over)
    result = load_text(yaml.safe_dump(data), "test.yaml")
    assert result.cluster is not None, result.diagnostics
    return result.cluster


# ---------------------------------------------------------------- parsers on real outputs
def test_proc_mounts_fixture_parses_every_line() -> None:
    entries = storage.parse_proc_mounts(_fixture("proc-mounts/util-linux-mtab.txt"))
    assert len(entries) == 11
    assert entries[0] == MountEntry("/dev/sda4", "/", "ext3", ("rw", "noatime"))
    gvfs = entries[9]
    assert gvfs.fstype == "fuse.gvfs-fuse-daemon" and gvfs.option("user") == "kzak" and gvfs.option("nosuid") == ""
    assert entries[1].option("noatime") is None


def test_workstation_table_has_none_of_the_cluster_mounts() -> None:
    observed = storage.parse_proc_mounts(_fixture("proc-mounts/util-linux-mtab.txt"))
    expected = storage.expected_mounts(_cluster())["gpu01"]
    found = storage.mount_findings("gpu01", expected, observed)
    assert [(f.check, f.severity, f.message) for f in found] == [
        ("storage", "error", "/home: nfs mount missing (nothing mounted there)"),
        ("storage", "error", "/lustre/scratch: lustre mount missing (nothing mounted there)"),
    ]
    assert found[0].expected == "10.30.0.19:/export/home" and found[0].hint.startswith("systemctl status home.mount")


def test_findmnt_json_without_matches_is_an_empty_table() -> None:
    assert storage.parse_findmnt_json(_fixture("findmnt/util-linux-filter-types-nomatch-json.txt")) == []
    assert storage.parse_mounts(_fixture("findmnt/util-linux-filter-types-nomatch-json.txt")) == []


def test_findmnt_json_tree_is_flattened_parents_first() -> None:
    # Shape of `findmnt -J` (util-linux): nested "children"; values here are test input, not a capture.
    text = ('{"filesystems": [{"target": "/", "source": "/dev/vda1", "fstype": "ext4", "options": "rw",'
            ' "children": [{"target": "/home", "source": "10.30.0.19:/export/home", "fstype": "nfs4",'
            ' "options": "rw,vers=4.2,proto=rdma,port=20049"}]}]}')
    entries = storage.parse_mounts(text)
    assert [e.target for e in entries] == ["/", "/home"]
    assert entries[1].option("proto") == "rdma"


@pytest.mark.parametrize("text", ["not json", '{"x": []}', '{"filesystems": [{"source": "a"}]}'])
def test_findmnt_garbage_is_refused(text: str) -> None:
    with pytest.raises(ParseError):
        storage.parse_findmnt_json(text if text != "not json" else "{not json")


def test_proc_mounts_short_line_is_refused_and_escapes_are_decoded() -> None:
    with pytest.raises(ParseError, match="line 1 has 2 fields"):
        storage.parse_proc_mounts("a b\n")
    (entry,) = storage.parse_proc_mounts("srv:/x /mnt/my\\040data nfs4 rw 0 0\n")
    assert entry.target == "/mnt/my data"


def test_dd_gnu_summaries() -> None:
    slow = storage.parse_dd(_fixture("dd/mate-applets-pr468-write.txt"))
    assert slow.bytes == 1073741824 and slow.seconds == pytest.approx(48.7581)
    assert slow.mb_per_s == pytest.approx(22.02, abs=0.01)  # dd itself printed 22.0 MB/s
    fast = storage.parse_dd(_fixture("dd/firecracker-pr1113.txt"))
    assert fast.mb_per_s == pytest.approx(295.4, abs=0.1)  # dd printed 295 MB/s


def test_busybox_dd_without_summary_is_refused() -> None:
    with pytest.raises(ParseError, match=r"no 'bytes \.\.\. copied' summary"):
        storage.parse_dd(_fixture("dd/linuxkit-pr3441-busybox.txt"))


def test_throughput_floor() -> None:
    res = storage.parse_dd(_fixture("dd/mate-applets-pr468-write.txt"))
    assert storage.throughput_finding("gpu01", "/home", res, None) is None
    assert storage.throughput_finding("gpu01", "/home", res, 20) is None
    bad = storage.throughput_finding("gpu01", "/home", res, 1000)
    assert bad is not None and bad.severity == "error" and bad.observed == 22.0 and bad.expected == 1000
    assert "22 MB/s" in bad.message


# ---------------------------------------------------------------- expected state from the spec
def test_expected_mounts_follow_the_spec() -> None:
    exp = storage.expected_mounts(_cluster())
    assert sorted(exp) == [f"gpu{i:02d}" for i in range(1, 9)]
    nfs, lustre = exp["gpu03"]
    assert nfs == ExpectedMount(kind="nfs", path="/home", sources=("10.30.0.19:/export/home", "sm1:/export/home"),
                                fstypes=("nfs4",), transport="rdma", version="4.2", nconnect=4, options=(),
                                automount=False, server="sm1", address="10.30.0.19", export="/export/home",
                                server_kernel=True, network="storage")
    assert lustre.sources == ("10.30.0.201@o2ib:10.30.0.202@o2ib:/scratch",) and lustre.options == ("flock",)
    assert "sm1" not in exp  # management nodes are not compute: no mounts


def test_nfs_v3_expects_fstype_nfs() -> None:
    c = _cluster(nfs={"exports": [{"server": "sm1", "path": "/export/home", "clients": "10.10.0.0/24"}],
                      "mounts": [{"server": "sm1", "export": "/export/home", "mount": "/home", "version": "3"}]},
                 lustre=[])
    (exp,) = storage.expected_mounts(c)["gpu01"]
    assert exp.fstypes == ("nfs",) and exp.transport == "tcp" and exp.nconnect is None


# ---------------------------------------------------------------- comparison (constructed kernel records)
RDMA_HOME = ExpectedMount("nfs", "/home", ("10.30.0.19:/export/home", "sm1:/export/home"), ("nfs4",), "rdma", "4.2",
                          4, ("noatime",))
GOOD_OPTS = ("rw", "noatime", "vers=4.2", "rsize=1048576", "wsize=1048576", "namlen=255", "hard", "nconnect=4",
             "proto=rdma", "port=20049", "timeo=600", "retrans=2", "sec=sys", "clientaddr=10.30.0.11",
             "local_lock=none", "addr=10.30.0.19")


def _entry(opts: Sequence[str] = GOOD_OPTS, source: str = "10.30.0.19:/export/home", fstype: str = "nfs4",
           target: str = "/home") -> MountEntry:
    return MountEntry(source, target, fstype, tuple(opts))


def test_matching_rdma_mount_has_no_finding() -> None:
    assert storage.compare_mount("gpu01", RDMA_HOME, _entry()) == []
    assert storage.compare_mount("gpu01", RDMA_HOME, _entry(source="sm1:/export/home")) == []


def test_tcp_fallback_is_an_error_with_the_rdma_hint() -> None:
    opts = [o for o in GOOD_OPTS if o not in ("proto=rdma", "port=20049")] + ["proto=tcp"]
    (f,) = storage.compare_mount("gpu01", RDMA_HOME, _entry(opts))
    assert (f.severity, f.expected, f.observed) == ("error", "rdma", "tcp")
    assert "rpcrdma" in f.hint and f.message == "/home: transport proto=tcp, the spec says rdma"


@pytest.mark.parametrize(("drop", "add", "expected_msg"), [
    ("vers=4.2", "vers=4.1", "NFS version 4.1, the spec says 4.2"),
    ("nconnect=4", None, "nconnect=1, the spec says 4"),
    ("noatime", "relatime", "option(s) noatime not in effect"),
    ("rw", "ro", "mounted read-only"),
])
def test_each_option_drift_is_named(drop: str, add: str | None, expected_msg: str) -> None:
    opts = [o for o in GOOD_OPTS if o != drop] + ([add] if add else [])
    found = storage.compare_mount("gpu01", RDMA_HOME, _entry(opts))
    assert [f.message for f in found] == [f"/home: {expected_msg}"]


def test_wrong_source_type_and_autofs() -> None:
    (src,) = storage.compare_mount("gpu01", RDMA_HOME, _entry(source="10.10.0.9:/export/home"))
    assert src.observed == "10.10.0.9:/export/home" and "wrong server or export" in src.hint
    (fst,) = storage.compare_mount("gpu01", RDMA_HOME, _entry(("rw",), source="/dev/sda1", fstype="ext4"))
    assert fst.observed == "ext4"
    auto = MountEntry("systemd-1", "/home", "autofs", ("rw", "fd=49", "direct"))
    (au,) = storage.compare_mount("gpu01", RDMA_HOME, auto)
    assert "spec asks for a mount at boot" in au.message
    (au2,) = storage.compare_mount("gpu01", ExpectedMount("nfs", "/home", RDMA_HOME.sources, ("nfs4",),
                                                          automount=True), auto)
    assert "did not trigger" in au2.message


def test_stacked_mount_uses_the_top_entry() -> None:
    autofs = MountEntry("systemd-1", "/home", "autofs", ("rw",))
    assert storage.mount_findings("gpu01", [RDMA_HOME], [autofs, _entry()]) == []
    assert len(storage.mount_findings("gpu01", [RDMA_HOME], [_entry(), autofs])) == 1


def test_lustre_source_accepts_nid_spelling_variants() -> None:
    exp = storage.expected_mounts(_cluster())["gpu01"][1]
    same = MountEntry("10.30.0.201@o2ib,10.30.0.202@o2ib:/scratch", "/lustre/scratch", "lustre", ("rw", "flock"))
    assert storage.compare_mount("gpu01", exp, same) == []
    other_fs = MountEntry("10.30.0.201@o2ib:10.30.0.202@o2ib:/work", "/lustre/scratch", "lustre", ("rw", "flock"))
    assert [f.observed for f in storage.compare_mount("gpu01", exp, other_fs)] == [other_fs.source]
    no_flock = MountEntry(exp.sources[0], "/lustre/scratch", "lustre", ("rw", "localflock"))
    assert "flock not in effect" in storage.compare_mount("gpu01", exp, no_flock)[0].message


def test_userspace_only_options_are_not_expected_in_the_kernel_table() -> None:
    exp = ExpectedMount("nfs", "/home", RDMA_HOME.sources, ("nfs4",), options=("_netdev", "nofail"))
    assert storage.compare_mount("gpu01", exp, _entry(("rw", "vers=4.2"))) == []


@pytest.mark.parametrize(("path", "unit"), [("/home", "home.mount"), ("/lustre/scratch", "lustre-scratch.mount"),
                                            ("/data/my-set", "data-my\\x2dset.mount"), ("/", "-.mount")])
def test_unit_names_match_systemd_escape(path: str, unit: str) -> None:
    assert storage.unit_name(path) == unit


# ---------------------------------------------------------------- probes and orchestration (fake remote)
def test_probe_and_dd_command_lines() -> None:
    auto = ExpectedMount("nfs", "/data/sets", ("a:/b",), ("nfs4",), automount=True)
    argv = storage.mounts_probe([RDMA_HOME, auto])
    assert argv[:2] == ["sh", "-c"] and "for p in /data/sets;" in argv[2] and argv[2].endswith("cat /proc/mounts")
    assert storage.mounts_probe([RDMA_HOME]) == ["sh", "-c", "cat /proc/mounts"]
    dd = storage.dd_argv("/home", 256)[2]
    assert "bs=1M count=256 conv=fsync" in dd and "rm -f /home/.provisioner-storage-dd" in dd
    with pytest.raises(ValueError):
        storage.dd_argv("/home; rm -rf /", 1)
    with pytest.raises(ValueError):
        storage.dd_argv("/home", 0)


class FakeRemote:
    """Answers from a node -> mount table map; files written by the round trip live in ``files``."""

    def __init__(self, tables: Mapping[str, str], shared: bool = True, dd_out: str = "",
                 unreachable: Sequence[str] = ()) -> None:
        self.tables = dict(tables)
        self.shared = shared
        self.dd_out = dd_out
        self.unreachable = set(unreachable)
        self.files: dict[tuple[str, str], str] = {}
        self.calls: list[tuple[str, list[str]]] = []

    def _key(self, host: str, path: str) -> tuple[str, str]:
        return ("shared" if self.shared else host, path)

    def run(self, host: str, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None) -> Completed:
        args = list(argv)
        self.calls.append((host, args))
        if host in self.unreachable:
            return Completed(255, "", "ssh: connect to host: No route to host")
        if args[0] == "sh" and "cat /proc/mounts" in args[2]:
            return Completed(0, self.tables.get(host, ""), "")
        if args[0] == "sh" and args[2].startswith("printf %s "):
            import shlex
            words = shlex.split(args[2])
            self.files[self._key(host, words[4])] = words[2]
            return Completed(0, "", "")
        if args[0] == "cat":
            content = self.files.get(self._key(host, args[1]))
            return Completed(0, content, "") if content is not None else Completed(1, "", "No such file")
        if args[0] == "rm":
            self.files.pop(self._key(host, args[2]), None)
            return Completed(0, "", "")
        if args[0] == "sh" and "dd if=/dev/zero" in args[2]:
            return Completed(0, self.dd_out, "")
        raise AssertionError(f"unexpected command {args}")

    def start(self, *a: Any, **k: Any) -> Any:
        raise AssertionError("not used")

    def run_many(self, commands: Mapping[str, Sequence[str]], timeout: float,
                 env: Mapping[str, str] | None = None) -> dict[str, Completed]:
        return {h: self.run(h, argv, timeout) for h, argv in commands.items()}


def _good_table(c: Cluster) -> str:
    return ("10.30.0.19:/export/home /home nfs4 " + ",".join(GOOD_OPTS) + " 0 0\n"
            "10.30.0.201@o2ib:10.30.0.202@o2ib:/scratch /lustre/scratch lustre rw,flock,lazystatfs 0 0\n")


def test_check_storage_all_good_with_roundtrip_and_throughput() -> None:
    c = _cluster(min_write_mbps=200)
    nodes = [f"gpu{i:02d}" for i in range(1, 9)]
    remote = FakeRemote({n: _good_table(c) for n in nodes}, dd_out=_fixture("dd/firecracker-pr1113.txt"))
    results = storage.check_storage(c, remote, write_mib=64, token=lambda: "t0k")
    by_name: dict[str, list[Any]] = {}
    for r in results:
        by_name.setdefault(r.name, []).append(r)
    assert len(by_name["storage"]) == 8 and all(r.passed for r in by_name["storage"])
    assert [(r.node, r.passed) for r in by_name["storage_roundtrip"]] == [("gpu02", True), ("gpu02", True)]
    assert [(r.node, r.measurements["write_mbps"]) for r in by_name["storage_throughput"]] == [
        ("gpu01", 295.4), ("gpu01", 295.4)]
    assert remote.files == {}  # round-trip files cleaned up


def test_check_storage_reports_missing_mount_unshared_data_and_unreachable_nodes() -> None:
    c = _cluster()
    tables = {f"gpu{i:02d}": _good_table(c) for i in range(1, 9)}
    tables["gpu05"] = _good_table(c).splitlines()[0] + "\n"  # Lustre missing on gpu05
    remote = FakeRemote(tables, shared=False, unreachable=["gpu08"])
    results = storage.check_storage(c, remote, token=lambda: "t0k")
    storage_by_node = {r.node: r for r in results if r.name == "storage"}
    assert storage_by_node["gpu08"].error is not None and not storage_by_node["gpu08"].ran
    assert not storage_by_node["gpu05"].passed
    assert storage_by_node["gpu05"].findings[0].message == (
        "/lustre/scratch: lustre mount missing (nothing mounted there)")
    trips = [r for r in results if r.name == "storage_roundtrip"]
    assert trips and all(not r.passed for r in trips)
    assert trips[0].findings[0].message.endswith("file written on gpu01 is not visible from gpu02")
    assert not [r for r in results if r.name == "storage_throughput"]  # no floor in the spec: no dd


def test_no_storage_in_spec_means_nothing_to_run() -> None:
    c = _cluster(nfs={"exports": [], "mounts": []}, lustre=[])
    remote = FakeRemote({})
    assert storage.check_storage(c, remote) == [] and remote.calls == []


# ---------------------------------------------------------------- nodes that cannot mount (site says optional)
def _by_name(results: Sequence[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for r in results:
        out.setdefault(r.name, []).append(r)
    return out


def test_lab_overlay_makes_nfs_and_lustre_optional_but_not_by_default() -> None:
    assert storage.optional_kinds(lab_cluster()) == {"nfs", "lustre", "nfsd"}
    assert storage.optional_kinds(lab_cluster({})) == frozenset()
    assert storage.optional_kinds(lab_cluster({"nfs_client_require_kernel_nfs": True})) == frozenset()


def test_kernel_probe_runs_the_roles_test_and_parses_its_answer() -> None:
    argv = storage.kernel_probe(["nfs", "lustre", "nfs"])
    assert argv[:2] == ["sh", "-c"]
    assert argv[2] == ("if grep -qw lustre /proc/filesystems || modinfo lustre >/dev/null 2>&1; then echo lustre=yes; "
                       "else echo lustre=no; fi; if grep -Eqw 'nfs4?' /proc/filesystems || modinfo nfs >/dev/null "
                       "2>&1; then echo nfs=yes; else echo nfs=no; fi")
    assert storage.parse_kernel_probe("nfs=no\nlustre=yes\nbogus=yes\nnfsd=maybe\n") == {"nfs": False,
                                                                                      "lustre": True}


def test_missing_mount_on_a_kernel_without_nfs_is_skipped_never_passed() -> None:
    remote = NoKernelNfsRemote()
    results = _by_name(storage.check_storage(lab_cluster(), remote, token=lambda: "t0k"))
    mounts = results["storage"]
    assert [r.node for r in mounts] == ["gpu01", "gpu02", "gpu03"]
    for r in mounts:
        assert not r.passed and r.ran and r.skipped == ("no kernel NFS client (declared optional): /shared not "
                                                          "mounted")
        assert [(f.severity, f.message) for f in r.findings] == [
            ("info", "/shared: nfs mount skipped, not checked: the kernel has no NFS client and the site says it "
                     "need not (nfs_client_require_kernel_nfs: false)")]
        assert r.measurements == {"mounts_expected": 1, "mounts_ok": 0, "mounts_skipped": 1}
    assert "storage_roundtrip" not in results  # nothing mounted: no kernel round trip to do
    (export,) = results["storage_export"]
    assert export.passed and export.node == "sm1"
    assert export.measurements == {"export": "/export/shared", "writer": "gpu01", "reader": "gpu02",
                                   "via": "libnfs NFSv4"}
    hosts = [h for h, _ in remote.calls]
    assert hosts[-4:] == ["gpu01", "gpu02", "sm1", "sm1"]  # write over NFS, read over NFS, look on server, clean
    assert remote.exported == {}  # the token file is removed on the server


def test_missing_mount_fails_when_the_kernel_has_nfs_or_the_site_requires_it() -> None:
    with_nfs = _by_name(storage.check_storage(lab_cluster(), NoKernelNfsRemote(kernel_nfs=["gpu02"])))
    by_node = {r.node: r for r in with_nfs["storage"]}
    assert by_node["gpu01"].skipped and by_node["gpu03"].skipped
    gpu02 = by_node["gpu02"]
    assert not gpu02.passed and gpu02.skipped is None
    assert gpu02.findings[0].severity == "error" and "mount missing" in gpu02.findings[0].message
    required = _by_name(storage.check_storage(lab_cluster({}), NoKernelNfsRemote()))
    assert all(not r.passed and r.skipped is None for r in required["storage"])
    assert "storage_export" not in required


def test_a_wrong_mount_is_never_excused_by_the_site_switch() -> None:
    table = "10.30.0.21:/export/shared /shared nfs4 ro,vers=4.2,proto=tcp 0 0\n"
    remote = NoKernelNfsRemote(tables={"gpu01": table})
    r = next(r for r in storage.check_storage(lab_cluster(), remote) if r.node == "gpu01")
    assert not r.passed and r.skipped is None and [f.message for f in r.findings] == ["/shared: mounted read-only"]


def test_export_not_served_is_an_error_on_the_server() -> None:
    results = _by_name(storage.check_storage(lab_cluster(), NoKernelNfsRemote(served=False), token=lambda: "t0k"))
    (export,) = results["storage_export"]
    assert not export.passed and export.ran
    (f,) = export.findings
    assert (f.check, f.severity, f.node, f.peer) == ("storage_export", "error", "sm1", "gpu01")
    assert f.message == ("sm1:/export/shared: gpu01 cannot write to the export over NFS (Failed to mount nfs share : "
                         "nfs_service failed; Failed to open nfs://10.30.0.21/export/shared/x?version=4)")


def test_export_written_elsewhere_than_the_specs_path_is_an_error() -> None:
    results = _by_name(storage.check_storage(lab_cluster(), NoKernelNfsRemote(server_dir_differs=True)))
    (export,) = results["storage_export"]
    assert [f.message for f in export.findings] == [
        "sm1:/export/shared: a file written over NFS is not in /export/shared on sm1 itself"]


def test_export_check_without_libnfs_tools_could_not_run() -> None:
    results = _by_name(storage.check_storage(lab_cluster(), NoKernelNfsRemote(no_tools=["gpu01"])))
    (export,) = results["storage_export"]
    assert not export.ran and export.error == "gpu01: exit 127: nfs-cp: not installed (libnfs-utils)"


def test_kernel_export_on_a_server_without_nfsd_is_skipped_when_declared_optional() -> None:
    data = yaml.safe_load(LAB_SPEC.read_text(encoding="utf-8"))
    data["storage"]["nfs"]["exports"][0]["implementation"] = "kernel"
    from provisioner.lab.cluster import LAB_SITE_VARS

    res = load_text(yaml.safe_dump(data), "cluster.yaml", overlay={"site_vars": dict(LAB_SITE_VARS)})
    assert res.cluster is not None
    remote = NoKernelNfsRemote()
    (export,) = _by_name(storage.check_storage(res.cluster, remote))["storage_export"]
    assert export.skipped == ("/export/shared is a kernel export and sm1's kernel has no nfsd (declared optional): "
                              "nothing can serve it")
    assert not any("nfs-cp" in " ".join(a) for _, a in remote.calls)


def test_export_probe_urls_and_command_lines() -> None:
    probe = storage.ExportProbe("sm1", "10.0.0.2", "/export/home/", "4.1", "a", "b", ".f", "tok en", read_only=False)
    assert probe.url(".f") == "nfs://10.0.0.2/export/home/.f?version=4"
    assert probe.server_file == "/export/home/.f"
    assert "printf %s 'tok en' > \"$t\" && nfs-cp \"$t\" 'nfs://10.0.0.2/export/home/.f?version=4'" in \
        probe.write_argv()[2]
    v3 = storage.ExportProbe("sm1", "fd00::2", "/x", "3", "a", "a", ".f", "t")
    assert v3.url() == "nfs://[fd00::2]/x/?version=3"
    with pytest.raises(ValueError, match="unsafe"):
        storage.ExportProbe("sm1", "10.0.0.2", "/x;reboot", "4.2", "a", "a", ".f", "t").write_argv()
