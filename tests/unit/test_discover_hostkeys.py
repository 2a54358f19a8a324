"""`provision discover --fingerprints/--fingerprint/--jump`: a new cluster's host keys are verified against the
consoles' fingerprints before any node is probed (there is no spec yet for trust-host to read), straight or through
a bastion. Against the in-process paramiko servers on 127.0.0.1 (tests/unit/_ssh_servers.py): the probe really runs
over SSH there, on this machine, so only the host-key outcome and what reached the servers are asserted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest
import yaml

from provisioner.cli import main
from provisioner.discover import PROBE, PROBE_TIMEOUT_S, discover, jump_option, targets, trust_first
from provisioner.errors import RemoteError, UsageError
from provisioner.hostkeys import fingerprint, recorded_host_keys
from provisioner.remote import JumpTarget, SshTarget, command_line
from provisioner.spec import load_text
from provisioner.spec.cluster import Cluster
from tests.unit._ssh_servers import Site, keyfile, site_servers
from tests.unit.test_discover import LabRemote, lab  # noqa: F401  (lab: the fixture)


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    with site_servers(tmp_path) as servers:
        yield servers


def _line(port: int, key: paramiko.PKey) -> str:
    return f"[127.0.0.1]:{port} {key.get_name()} {key.get_base64()}\n"


def _discover(site: Site, tmp_path: Path, known: Path, *extra: str) -> int:
    return main(["discover", "node1", "--address", "127.0.0.1", "--port", str(site.node.port), "--key",
                 str(site.client_file), "--known-hosts", str(known), "--name", "t", "--out", str(tmp_path / "d.yaml"),
                 *extra])


PROBE_LINE = command_line(["sh", "-c", PROBE], None, PROBE_TIMEOUT_S)


def _other(tmp_path: Path) -> str:
    return fingerprint(paramiko.Ed25519Key.from_private_key_file(keyfile(tmp_path)))


# --- straight to the nodes -------------------------------------------------------------------------------------
def test_fingerprint_records_the_key_then_the_node_is_probed(site: Site, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    known = tmp_path / "new" / "known_hosts"
    known.parent.mkdir()
    offered = fingerprint(site.node.host_key)
    assert _discover(site, tmp_path, known, "--fingerprint", offered) in (0, 1)  # 1: this machine is no GPU node
    assert f"host key of node1: trusted: {offered}" in capsys.readouterr().err
    assert known.read_text() == f"node1,[127.0.0.1]:{site.node.port} ssh-ed25519 {site.node.host_key.get_base64()}\n"
    assert site.node.log.commands == [PROBE_LINE]  # the probe ran once, with the key now checked
    assert "jump" not in yaml.safe_load((tmp_path / "d.yaml").read_text())["ssh"]
    assert site.bastion.log.connections == 0


def test_a_mismatch_is_refused_naming_both_fingerprints_and_nothing_is_probed(
        site: Site, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    known = tmp_path / "kh"  # not the servers' known_hosts, which trusts both
    wrong = _other(tmp_path)
    fps = tmp_path / "fingerprints"
    fps.write_text(f"# rack 1, read on the consoles\nnode1 {wrong}\n")
    assert _discover(site, tmp_path, known, "--fingerprints", str(fps)) == 2
    err = capsys.readouterr().err
    assert f"node1 offers host key {fingerprint(site.node.host_key)}, not the {wrong} you gave" in err
    assert "host key refused for node1; no node was probed" in err
    assert not known.exists() and not (tmp_path / "d.yaml").exists()
    assert site.node.log.commands == []


def test_without_the_option_nothing_is_learnt(site: Site, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    known = tmp_path / "kh"  # not the servers' known_hosts, which trusts both
    known.write_text("")
    assert _discover(site, tmp_path, known) == 2  # as before: the one node is not read, nothing to draft
    assert f"host key ssh-ed25519 {fingerprint(site.node.host_key)} is not in" in capsys.readouterr().err
    assert known.read_text() == "" and site.node.log.commands == []


def _hosts(tmp_path: Path) -> dict[str, SshTarget]:
    return targets("gpu[01-02]", "10.0.0.[1-2]", user="root", port=22, key=None, known_hosts=tmp_path / "kh")


def test_a_key_with_no_fingerprint_given_is_never_trusted(tmp_path: Path) -> None:
    keys = {}
    for n in ("gpu01", "gpu02"):
        (tmp_path / n).mkdir()
        keys[n] = paramiko.Ed25519Key.from_private_key_file(keyfile(tmp_path / n))
    hosts = _hosts(tmp_path)
    said: list[str] = []
    with pytest.raises(RemoteError, match="host key refused for gpu02; no node was probed"):
        trust_first(hosts, {"gpu01": fingerprint(keys["gpu01"])}, fetch=lambda t: keys[t.name], progress=said.append)
    assert [fingerprint(k) for k in recorded_host_keys(hosts["gpu01"])] == [fingerprint(keys["gpu01"])]
    assert recorded_host_keys(hosts["gpu02"]) == []
    assert any(s.startswith("host key of gpu02: refused:") and "without a fingerprint" in s for s in said)


def test_fingerprints_for_other_nodes_and_one_fingerprint_for_several_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not in the hosts to discover: gpu09"):
        trust_first(_hosts(tmp_path), {"gpu09": _other(tmp_path)}, fetch=lambda t: pytest.fail("nothing is read"))
    assert main(["discover", "gpu[01-02]", "--address", "10.0.0.[1-2]", "--known-hosts", str(tmp_path / "kh"),
                 "--fingerprint", _other(tmp_path)]) == 2
    assert not (tmp_path / "kh").exists()


# --- through a bastion -----------------------------------------------------------------------------------------
def test_through_the_bastion_a_matching_key_is_recorded_and_the_draft_names_it(
        site: Site, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    known = tmp_path / "kh"  # not the servers' known_hosts, which trusts both
    known.write_text(_line(site.bastion.port, site.bastion.host_key))
    fps = tmp_path / "fingerprints"
    fps.write_text(f"node1 {fingerprint(site.node.host_key)}\n")
    rc = _discover(site, tmp_path, known, "--fingerprints", str(fps), "--jump", f"ops@127.0.0.1:{site.bastion.port}")
    assert rc in (0, 1), capsys.readouterr().err
    assert [fingerprint(k) for k in recorded_host_keys(SshTarget("node1", "127.0.0.1", "root", site.node.port, None,
                                                                 known))] == [fingerprint(site.node.host_key)]
    # the key read and the probe both went through the bastion, to the node's address as given
    assert site.bastion.log.forwards == [("127.0.0.1", site.node.port)] * 2 and site.bastion.log.commands == []
    assert site.node.log.commands == [PROBE_LINE]
    ssh = yaml.safe_load((tmp_path / "d.yaml").read_text())["ssh"]
    assert ssh["jump"] == {"host": "127.0.0.1", "user": "ops", "port": site.bastion.port}


def test_through_the_bastion_a_mismatch_is_refused_naming_both(site: Site, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    known = tmp_path / "kh"  # not the servers' known_hosts, which trusts both
    known.write_text(_line(site.bastion.port, site.bastion.host_key))
    wrong = _other(tmp_path)
    assert _discover(site, tmp_path, known, "--fingerprint", wrong, "--jump",
                     f"{{host: 127.0.0.1, user: ops, port: {site.bastion.port}}}") == 2
    assert f"node1 offers host key {fingerprint(site.node.host_key)}, not the {wrong} you gave" in \
        capsys.readouterr().err
    assert known.read_text() == _line(site.bastion.port, site.bastion.host_key)
    assert site.node.log.commands == []


def test_an_unknown_bastion_is_refused_and_no_node_is_contacted(site: Site, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    known = tmp_path / "kh"  # not the servers' known_hosts, which trusts both
    known.write_text("")
    assert _discover(site, tmp_path, known, "--fingerprint", fingerprint(site.node.host_key), "--jump",
                     f"ops@127.0.0.1:{site.bastion.port}") == 2
    err = capsys.readouterr().err
    assert f"bastion ops@127.0.0.1:{site.bastion.port}: host key ssh-ed25519 {fingerprint(site.bastion.host_key)} " \
        f"is not in {known}" in err
    assert known.read_text() == ""
    assert site.node.log.connections == 0 and site.bastion.log.forwards == []


@pytest.mark.parametrize(("text", "fields"), [
    ("bastion.example.com", {"host": "bastion.example.com", "user": None, "port": 22}),
    ("ops@10.1.0.5:2222", {"host": "10.1.0.5", "user": "ops", "port": 2222}),
    ("{host: bastion, user: ops}", {"host": "bastion", "user": "ops", "port": 22}),
])
def test_jump_forms(text: str, fields: dict[str, object]) -> None:
    assert jump_option(text).model_dump() == fields


@pytest.mark.parametrize(("text", "why"), [
    ("ops@-oProxyCommand=x", "host: String should match pattern"),  # never an option on ssh's command line
    ("ops@10.0.0.300", "not an IPv4 address"),
    ("Root@bastion", "user: String should match pattern"),
    ("bastion:0", "port: Input should be greater than or equal to 1"),
    ("bastion:ssh", "port: Input should be a valid integer"),
    ("{host: bastion, proxy: x}", "proxy: Extra inputs are not permitted"),
    ("{host: [a", "not a YAML mapping"),
])
def test_jump_is_validated_like_the_spec(text: str, why: str) -> None:
    with pytest.raises(UsageError, match="--jump") as err:
        jump_option(text)
    assert why in err.value.message and "\n" not in err.value.message


def test_behind_a_bastion_names_are_left_for_it_to_resolve(tmp_path: Path) -> None:
    hop = JumpTarget(host="bastion", user="ops", port=22, key=None, known_hosts=tmp_path / "kh")
    out = targets("gpu[01-02]", None, user="root", port=22, key=None, known_hosts=tmp_path / "kh", jump=hop)
    assert {(t.address, t.jump) for t in out.values()} == {("gpu01", hop), ("gpu02", hop)}


def test_the_drafts_jump_validates_as_the_specs(lab: tuple[Path, Cluster]) -> None:  # noqa: F811
    root, _ = lab
    hosts = targets("gpu[01-03],sm[1-2]", "10.213.38.[11-13],10.213.38.[21-22]", user="root", port=22, key=None,
                    known_hosts=root / "known_hosts")
    ssh = {"user": "root", "known_hosts": "known_hosts", "port": 22,
           "jump": jump_option("ops@bastion.example.com:2222").model_dump()}
    draft = discover(LabRemote(root), hosts, cluster_name="lab", ssh=ssh)
    res = load_text(draft.text, "<draft>")
    assert res.cluster is not None and not res.errors, [d.format() for d in res.errors]
    jump = res.cluster.spec.ssh.jump
    assert jump is not None and (jump.host, jump.user, jump.port) == ("bastion.example.com", "ops", 2222)
