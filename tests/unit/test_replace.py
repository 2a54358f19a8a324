"""provision replace-node: host-key decisions, known_hosts rewrite, hardware discovery, peer choice, step order.

The SSH host-key tests run a real paramiko SSH server on loopback; the orchestration tests drive
`replace_node` with a scripted run engine, remote and verifier so the order and the limits of every step
can be asserted without containers (the lab test does the real thing).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import paramiko
import pytest

from provisioner.day2 import peers
from provisioner.day2.replace import (
    HostKeyRefused,
    _Capture,
    check_fingerprint,
    decide_host_key,
    observe,
    parse_board_serial,
    parse_gpu_serials,
    parse_sysfs_probe,
    replace_node,
    summary_lines,
    trust_new_key,
)
from provisioner.errors import RemoteError, UsageError
from provisioner.fabric.findings import CheckResult
from provisioner.hostkeys import fingerprint, recorded_host_keys, replace_host_key
from provisioner.phases import NullReporter, RunOptions
from provisioner.remote import Completed, SshTarget
from provisioner.report import VerifyReport
from provisioner.spec import load_cluster
from provisioner.spec.cluster import Cluster
from provisioner.state import (
    HostProgress,
    PhaseRecord,
    RunJournal,
    current_hardware,
    hardware_history,
    load_hardware,
    record_hardware,
)

from ._parser_fixtures import load

FP_A = "SHA256:" + "A" * 43
FP_B = "SHA256:" + "B" * 43

SPEC = """\
cluster: {name: rep, os: debian-12}
repositories: {offline: false}
ssh: {user: root, known_hosts: known_hosts}
software:
  driver: {version: "550.90.07", kernel_modules: open}
  cuda: "12.4.1"
  nccl: "2.21.5"
  ofed: {flavor: doca, version: "2.9.1"}
profiles:
  gpu2:
    gpu: {model: H100-SXM5-80GB, count: 2, nvswitch: true}
    hcas: [{device: "mlx5_[0-1]", rate: NDR}]
  svc:
    hcas: [{device: mlx5_0, rate: NDR}]
nodes:
  - {name: "gpu[01-04]", address: "127.0.0.[11-14]", profile: gpu2}
  - {name: sm1, address: 127.0.0.21, profile: svc, roles: [subnet_manager]}
switches:
  - {name: "leaf[1-2]", tier: leaf, ports: 64, uplinks: 8}
  - {name: spine1, tier: spine, ports: 64}
fabric:
  rate: NDR
  topology:
    kind: rail_optimized
    cabling:
      - {nodes: "gpu[01-04]", hca: mlx5_0, switch: leaf1, ports: 1-4}
      - {nodes: "gpu[01-04]", hca: mlx5_1, switch: leaf2, ports: 1-4}
      - {nodes: sm1, hca: mlx5_0, switch: leaf1, ports: "31"}
  subnet_manager:
    kind: opensm
    nodes: [{node: sm1, priority: 15}]
  partitions:
    - {name: tenant_a, pkey: 0x8001, members: "gpu[01-02]"}
"""


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(SPEC)
    (tmp_path / "known_hosts").write_text("")
    return path


@pytest.fixture
def cluster(spec: Path) -> Cluster:
    return load_cluster(spec)[0]


# ---------------------------------------------------------------- host-key decisions


def test_new_key_without_a_flag_is_refused_with_its_fingerprint_and_the_next_step() -> None:
    with pytest.raises(HostKeyRefused) as exc:
        decide_host_key("gpu01", FP_B, [FP_A], accept_new=False, expected=None)
    text = str(exc.value)
    assert FP_B in text and FP_A in text
    assert f"--host-key-fingerprint {FP_B}" in text and "--accept-new-host-key" in text
    assert exc.value.exit_code == 2


def test_an_explicit_fingerprint_must_match_the_offered_key() -> None:
    with pytest.raises(HostKeyRefused, match="not the"):
        decide_host_key("gpu01", FP_B, [FP_A], accept_new=True, expected=FP_A)
    assert decide_host_key("gpu01", FP_B, [FP_A], accept_new=False, expected=FP_B).action == "replace"


def test_accept_new_replaces_and_a_known_key_stays() -> None:
    assert decide_host_key("gpu01", FP_B, [FP_A], accept_new=True, expected=None).action == "replace"
    assert decide_host_key("gpu01", FP_A, [FP_A], accept_new=False, expected=None).action == "known"
    with pytest.raises(HostKeyRefused):  # a fingerprint that contradicts the already trusted key is not ignored
        decide_host_key("gpu01", FP_A, [FP_A], accept_new=False, expected=FP_B)


@pytest.mark.parametrize("bad", ["", "SHA256:short", "MD5:" + "A" * 43, "SHA256:" + "A" * 42 + "!"])
def test_fingerprint_option_is_checked(bad: str) -> None:
    with pytest.raises(UsageError):
        check_fingerprint(bad)
    assert check_fingerprint(f" {FP_A} ") == FP_A
    assert check_fingerprint(None) is None


# ---------------------------------------------------------------- known_hosts rewrite


def _target(kh: Path, address: str = "127.0.0.11", port: int = 22, name: str = "gpu01") -> SshTarget:
    return SshTarget(name=name, address=address, user="root", port=port, key=None, known_hosts=kh)


def test_replace_host_key_comments_out_only_the_nodes_lines(tmp_path: Path) -> None:
    old, other, new = paramiko.ECDSAKey.generate(), paramiko.ECDSAKey.generate(), paramiko.ECDSAKey.generate()
    kh = tmp_path / "known_hosts"
    hashed = paramiko.HostKeys.hash_host("127.0.0.11")
    kh.write_text(
        "# site keys\n"
        f"gpu01,127.0.0.11 {old.get_name()} {old.get_base64()}\n"
        f"{hashed} {old.get_name()} {old.get_base64()}\n"
        f"gpu02,127.0.0.12 {other.get_name()} {other.get_base64()}\n"
        f"@cert-authority *.lab {other.get_name()} {other.get_base64()}\n"
    )
    kh.chmod(0o600)
    target = _target(kh)
    removed = replace_host_key(target, new, "replaced by test")
    assert len(removed) == 2
    text = kh.read_text()
    assert text.count("# replaced by test: ") == 2
    assert f"gpu02,127.0.0.12 {other.get_name()} {other.get_base64()}" in text.splitlines()
    assert "@cert-authority" in text
    assert [fingerprint(k) for k in recorded_host_keys(target)] == [fingerprint(new)]
    plain = tmp_path / "plain"  # paramiko cannot load @cert-authority lines; OpenSSH can: check the rest
    plain.write_text("".join(ln + "\n" for ln in text.splitlines() if not ln.startswith("@")))
    keys = paramiko.HostKeys(str(plain))
    assert keys.lookup("127.0.0.11") is not None
    assert keys.lookup("127.0.0.11")[new.get_name()].get_base64() == new.get_base64()  # type: ignore[index]
    assert keys.lookup("127.0.0.12")[other.get_name()].get_base64() == other.get_base64()  # type: ignore[index]
    assert kh.stat().st_mode & 0o777 == 0o600


class _KeyServer:
    """An SSH server on loopback that only shows its host key (what fetch_host_key needs)."""

    def __init__(self, key: paramiko.PKey) -> None:
        self.key = key
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self._stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            try:
                transport = paramiko.Transport(conn)
                transport.add_server_key(self.key)
                transport.start_server(server=paramiko.ServerInterface())
                transport.join(10)  # until the client hangs up
            except (paramiko.SSHException, EOFError, OSError):
                pass  # the client hangs up after reading the key: that is the whole conversation
            finally:
                conn.close()

    def close(self) -> None:
        self._stop = True
        self.sock.close()


@pytest.fixture
def key_server() -> Iterator[_KeyServer]:
    server = _KeyServer(paramiko.ECDSAKey.generate())
    yield server
    server.close()


def test_trust_new_key_refuses_then_accepts_against_a_real_ssh_server(tmp_path: Path,
                                                                        key_server: _KeyServer) -> None:
    old = paramiko.ECDSAKey.generate()
    kh = tmp_path / "known_hosts"
    kh.write_text(f"gpu01,[127.0.0.1]:{key_server.port} {old.get_name()} {old.get_base64()}\n")
    before = kh.read_bytes()
    target = _target(kh, "127.0.0.1", key_server.port)
    offered = fingerprint(key_server.key)
    seen: list[str] = []

    with pytest.raises(HostKeyRefused, match=offered.replace("+", r"\+")):
        trust_new_key(target, tmp_path, accept_new=False, expected=None, progress=seen.append)
    assert kh.read_bytes() == before and not (tmp_path / "hardware.json").exists()
    assert any(offered in m for m in seen)  # shown before the refusal

    decision = trust_new_key(target, tmp_path, accept_new=False, expected=offered, progress=seen.append)
    assert decision.action == "replace" and decision.known == (fingerprint(old),)
    assert [fingerprint(k) for k in recorded_host_keys(target)] == [offered]
    assert "# replaced " in kh.read_text() and old.get_base64() in kh.read_text()
    history = hardware_history(tmp_path, "gpu01")
    assert [(c.kind, c.old, c.new) for c in history] == [("host_key", fingerprint(old), offered)]

    again = trust_new_key(target, tmp_path, accept_new=False, expected=None, progress=seen.append)
    assert again.action == "known" and len(hardware_history(tmp_path, "gpu01")) == 1


def test_an_unreachable_node_is_one_clean_error(tmp_path: Path) -> None:
    free = socket.create_server(("127.0.0.1", 0))
    port = int(free.getsockname()[1])
    free.close()
    with pytest.raises(RemoteError, match="gpu01"):
        trust_new_key(_target(tmp_path / "kh", "127.0.0.1", port), tmp_path, accept_new=True, expected=None,
                      progress=lambda _m: None)


# ---------------------------------------------------------------- hardware discovery


class FakeRemote:
    """Answers each command from a table keyed by the command's first words."""

    def __init__(self, answers: Mapping[str, Completed]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, list[str]]] = []

    def run(self, host: str, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None) -> Completed:
        self.calls.append((host, list(argv)))
        for prefix, done in self.answers.items():
            if " ".join(argv).startswith(prefix):
                return done
        return Completed(127, "", f"{argv[0]}: not found")

    def start(self, host: str, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None) -> Any:
        raise AssertionError("replace-node starts no background command")

    def run_many(self, commands: Mapping[str, Sequence[str]], timeout: float,
                 env: Mapping[str, str] | None = None) -> dict[str, Completed]:
        return {h: self.run(h, argv, timeout, env) for h, argv in commands.items()}


IBSTAT = load("ibstat", "mesa_cx4_initializing.txt")


def test_sysfs_probe_lines() -> None:
    guids, boards = parse_sysfs_probe("mlx5_0 248a:0703:0049:aee0 MT_2190110032\nmlx5_1 0000:0000:0000:0000 \n"
                                      "bad;name x y\n")
    assert guids == {"mlx5_0": "0x248a07030049aee0"}  # an all-zero GUID is no GUID
    assert boards == {"mlx5_0 board_id": "MT_2190110032"}


def test_placeholders_are_not_serials() -> None:
    assert parse_board_serial("Not Specified\n") is None
    assert parse_board_serial("To be filled by O.E.M.\n") is None
    assert parse_board_serial("") is None
    assert parse_gpu_serials("0, [N/A]\n1, N/A\n") == {}


def test_observe_reads_port_and_node_guids(tmp_path: Path) -> None:
    remote = FakeRemote({
        "ibstat": Completed(0, IBSTAT, ""),
        "sh -c for d in": Completed(0, "mlx5_0 248a:0703:0049:aee0 MT_2190110032\n", ""),
        "sh -c cat /sys/class/dmi": Completed(1, "", ""),
    })
    obs = observe(remote, "gpu01")
    assert obs.guids == {"mlx5_0/1": "0x248a07030049aee0", "mlx5_0": "0x248a07030049aee0"}
    assert obs.serials == {"mlx5_0 board_id": "MT_2190110032"}
    assert any("board serial" in u for u in obs.unreadable)
    assert {h for h, _ in remote.calls} == {"gpu01"}


def test_observe_without_any_guid_is_an_error() -> None:
    with pytest.raises(RemoteError, match="no InfiniBand port GUID"):
        observe(FakeRemote({}), "gpu01")


# ---------------------------------------------------------------- peers, subsets, tests


def test_peers_skip_unhealthy_nodes_and_the_node_itself(cluster: Cluster) -> None:
    assert peers.pick(cluster, ["gpu02"], set(), 2) == ["gpu01", "gpu03"]
    assert peers.pick(cluster, ["gpu02"], {"gpu01"}, 2) == ["gpu03", "gpu04"]
    assert peers.pick(cluster, ["gpu02"], {"gpu01", "gpu03", "gpu04"}, 2) == []
    assert peers.pick(cluster, ["sm1"], set(), 2) == []  # an SM node has no pairwise checks


def test_subset_keeps_only_the_named_nodes_and_their_cables(cluster: Cluster) -> None:
    sub = cluster.subset(["gpu02", "gpu04"])
    assert [n.name for n in sub.nodes] == ["gpu02", "gpu04"]
    assert {c.node for c in sub.cables} == {"gpu02", "gpu04"}
    assert len(cluster.nodes) == 5  # the original is untouched


def test_verify_tests_per_node_kind(cluster: Cluster) -> None:
    main, side = peers.checks(cluster, ["gpu01"], ["gpu02"], new_hardware=True)
    assert main[:2] == ["links", "versions"] and "bandwidth" in main and "nccl" in main
    assert side == ["gpudirect"]
    alone, side_alone = peers.checks(cluster, ["gpu01"], [], new_hardware=True)
    assert "bandwidth" not in alone and "nccl" not in alone and side_alone == []
    main_sm, side_sm = peers.checks(cluster, ["sm1"], [], new_hardware=True)
    assert "bandwidth" not in main_sm and side_sm == []
    assert cluster.sm_nodes() == ["sm1"]


def test_capture_notes_sm_config_change_and_restart() -> None:
    cap = _Capture(NullReporter())

    def ev(task: str, host: str, changed: bool, kind: str = "runner_on_ok") -> dict[str, Any]:
        return {"event": kind, "event_data": {"task": task, "host": host, "res": {"changed": changed}}}

    cap.event("fabric", ev("Write partitions.conf", "sm1", True))
    cap.event("fabric", ev("Write opensm.conf", "sm2", False))
    cap.event("fabric", ev("Restart opensm", "sm1", True))
    cap.event("ofed", ev("Restart opensm", "gpu01", True))  # not the fabric phase
    cap.event("fabric", ev("Reload opensm (SIGHUP)", "sm2", True))
    cap.event("fabric", ev("Reload opensm (SIGHUP)", "sm1", False, "runner_on_skipped"))
    assert cap.config_changed == {"sm1"} and cap.restarted == {"sm1"} and cap.reloaded == {"sm2"}


# ---------------------------------------------------------------- the whole command, scripted


def _journal(opts: RunOptions, status: str = "passed", aside: dict[str, dict[str, str]] | None = None) -> RunJournal:
    hosts = {h: HostProgress(list(opts.only), (aside or {}).get(h)) for h in (opts.limit or "").split(",")}
    j = RunJournal("r", "rep", "cluster.yaml", ["validate", "render", *opts.only], hosts, status=status)
    j.phases = [PhaseRecord(p, "ok" if status == "passed" else "partial", hosts=list(hosts)) for p in opts.only]
    return j


class ScriptedRuns:
    def __init__(self, fail_at: str | None = None) -> None:
        self.calls: list[tuple[list[str], str | None]] = []
        self.tags: list[list[str]] = []
        self.fail_at = fail_at

    def __call__(self, spec: Path, options: RunOptions, **kwargs: Any) -> RunJournal:
        self.calls.append((list(options.only), options.limit))
        self.tags.append(list(options.tags))
        if self.fail_at in options.only:
            aside = {options.limit or "": {"phase": self.fail_at, "state": "failed", "reason": "apt broke"}}
            return _journal(options, "partial", aside)
        return _journal(options)


def _report(failed: bool = False) -> VerifyReport:
    now = datetime(2025, 1, 1, tzinfo=UTC)
    check = CheckResult.could_not_run("links", "gpu01", "x") if failed else CheckResult.from_findings("links",
                                                                                                     "gpu01", [])
    return VerifyReport(cluster="rep", started=now, finished=now, checks=(check,))


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch, spec: Path) -> dict[str, Any]:
    new = paramiko.ECDSAKey.generate()
    monkeypatch.setattr("provisioner.day2.replace.fetch_host_key", lambda target, timeout=10.0: new)
    remote = FakeRemote({"ibstat": Completed(0, IBSTAT, "")})
    verified: list[tuple[str, list[str]]] = []

    def verifier(cluster: Cluster, nodes: Sequence[str], peers: Sequence[str], directory: Path, progress: Any,
                 remote: Any = None, new_hardware: bool = False) -> VerifyReport:
        assert new_hardware  # a replaced node's cables and IPoIB interfaces are checked too
        verified.extend((node, list(peers)) for node in nodes)
        return _report()

    return {"key": new, "remote": remote, "verified": verified, "verifier": verifier}


def test_replace_node_steps_in_order_limited_to_the_node_and_the_sm(spec: Path, tmp_path: Path,
                                                                    scripted: dict[str, Any]) -> None:
    state = tmp_path / "state"
    record_hardware(state, "gpu01", guids={"mlx5_0/1": "0x0000000000000abc"})
    runs = ScriptedRuns()
    result = replace_node(spec, "gpu01", state_dir=state, accept_new_host_key=True, run=runs,
                          remote_factory=lambda t: scripted["remote"], verifier=scripted["verifier"])
    # the GPU peers get only the nccl role's node-to-node SSH tasks: they must trust the new host and user keys
    assert runs.calls == [(["preflight", "repos", "ofed", "gpu_stack"], "gpu01"),
                          (["gpu_stack"], "gpu01,gpu02,gpu03,gpu04"), (["fabric"], "sm1"), (["fabric"], "gpu01"),
                          (["storage"], "gpu01")]
    assert runs.tags == [[], ["nccl_mpi_ssh_trust"], [], [], []]
    assert scripted["verified"] == [("gpu01", ["gpu02", "gpu03"])]
    assert [(c.key, c.old, c.new) for c in result.changes] == [("mlx5_0/1", "0x0000000000000abc",
                                                                "0x248a07030049aee0")]
    assert current_hardware(state, "gpu01")["guids"]["mlx5_0/1"] == "0x248a07030049aee0"
    assert result.exit_code == 0
    text = "\n".join(summary_lines(result))
    assert fingerprint(scripted["key"]) in text and "0x0000000000000abc -> 0x248a07030049aee0" in text
    assert "verify: PASS" in text
    kinds = [h["kind"] for h in load_hardware(state)["nodes"]["gpu01"]["history"]]
    assert kinds == ["host_key", "guid"]


def test_replace_node_stops_when_the_node_is_set_aside(spec: Path, tmp_path: Path,
                                                       scripted: dict[str, Any]) -> None:
    runs = ScriptedRuns(fail_at="preflight")
    result = replace_node(spec, "gpu02", state_dir=tmp_path / "s", accept_new_host_key=True, run=runs,
                          remote_factory=lambda t: scripted["remote"], verifier=scripted["verifier"])
    assert runs.calls == [(["preflight", "repos", "ofed", "gpu_stack"], "gpu02")]
    assert scripted["verified"] == [] and result.exit_code == 1
    assert result.stopped is not None and "apt broke" in result.stopped and "rerun provision replace-node" in \
        result.stopped
    assert "stopped:" in "\n".join(summary_lines(result))


def test_replace_node_refuses_before_changing_anything(spec: Path, tmp_path: Path,
                                                       scripted: dict[str, Any]) -> None:
    old = paramiko.ECDSAKey.generate()
    kh = spec.parent / "known_hosts"
    kh.write_text(f"gpu01,127.0.0.11 {old.get_name()} {old.get_base64()}\n")
    runs = ScriptedRuns()
    with pytest.raises(HostKeyRefused, match=fingerprint(scripted["key"]).replace("+", r"\+")):
        replace_node(spec, "gpu01", state_dir=tmp_path / "s", run=runs,
                     remote_factory=lambda t: scripted["remote"], verifier=scripted["verifier"])
    assert runs.calls == [] and kh.read_text().startswith("gpu01,127.0.0.11")
    with pytest.raises(UsageError, match="gpu09 is not a node"):
        replace_node(spec, "gpu09", state_dir=tmp_path / "s", run=runs)


def test_replace_node_failing_verification_exits_1(spec: Path, tmp_path: Path, scripted: dict[str, Any]) -> None:
    def bad(*args: Any, **kwargs: Any) -> VerifyReport:
        now = datetime(2025, 1, 1, tzinfo=UTC)
        from provisioner.fabric.findings import Finding

        f = Finding("links", "error", "gpu01", "mlx5_0", 1, "Active", "Down", "port down", "reseat the cable")
        return VerifyReport(cluster="rep", started=now, finished=now,
                            checks=(CheckResult.from_findings("links", "gpu01", [f]),))

    result = replace_node(spec, "gpu01", state_dir=tmp_path / "s", accept_new_host_key=True, run=ScriptedRuns(),
                          remote_factory=lambda t: scripted["remote"], verifier=bad)
    assert result.exit_code == 1
    assert "port down" in "\n".join(summary_lines(result))


def test_unhealthy_nodes_come_from_the_last_run_and_the_last_verify(tmp_path: Path) -> None:
    import json

    from provisioner.day2.peers import unhealthy_nodes
    from provisioner.state import save_journal

    assert unhealthy_nodes(tmp_path) == set()
    j = RunJournal("20250101T000000.000000Z-abc", "rep", "cluster.yaml", ["preflight"],
                   {"gpu04": HostProgress([], {"phase": "preflight", "state": "unreachable", "reason": "x"}),
                    "gpu01": HostProgress(["preflight"])}, status="partial")
    save_journal(tmp_path, j)
    latest = tmp_path / "verify" / "latest"
    latest.mkdir(parents=True)
    findings = [{"severity": "error", "node": "gpu03"}, {"severity": "warning", "node": "gpu02"},
                {"severity": "error", "node": None}]
    (latest / "report.json").write_text(json.dumps({"findings": findings}))
    assert unhealthy_nodes(tmp_path) == {"gpu03", "gpu04"}


def test_cli_errors_are_one_line(spec: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from provisioner.cli import main

    assert main(["replace-node", str(spec), "gpu09"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("provision: error: gpu09 is not a node") and "Traceback" not in err[0]
    assert main(["replace-node", str(spec), "gpu01", "--host-key-fingerprint", "MD5:xx"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a SHA256 fingerprint" in err[0]


def test_replacing_the_sm_node_reconverges_the_sm_and_verifies_it_alone(spec: Path, tmp_path: Path,
                                                                        scripted: dict[str, Any]) -> None:
    runs = ScriptedRuns()
    result = replace_node(spec, "sm1", state_dir=tmp_path / "s", accept_new_host_key=True, run=runs,
                          remote_factory=lambda t: scripted["remote"], verifier=scripted["verifier"])
    assert runs.calls == [(["preflight", "repos", "ofed", "gpu_stack"], "sm1"), (["fabric"], "sm1"),
                          (["storage"], "sm1")]
    assert scripted["verified"] == [("sm1", [])] and result.exit_code == 0
    assert "no peer (links and versions only)" in "\n".join(summary_lines(result))
