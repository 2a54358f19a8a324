"""provisioner.remote through a bastion (ssh.jump), against in-process paramiko SSH servers on 127.0.0.1.

The servers (tests/unit/_ssh_servers.py): a node that runs commands with ``sh -c``, and a bastion that relays
``direct-tcpip`` channels as sshd does for ``ssh -W``/ProxyJump and runs nothing itself.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from provisioner.errors import RemoteError
from provisioner.fabric import reach
from provisioner.hostkeys import fingerprint
from provisioner.remote import JumpTarget, SshRemote, SshTarget
from tests.unit._ssh_servers import Site, keyfile, site_servers


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    with site_servers(tmp_path) as servers:
        yield servers


def _targets(site: Site, names: tuple[str, ...] = ("node1",), *, bastion_port: int | None = None,
             node_port: int | None = None, known: Path | None = None) -> dict[str, SshTarget]:
    kh = known or site.known_hosts
    jump = JumpTarget(host="127.0.0.1", user="ops", port=bastion_port or site.bastion.port, key=site.client_file,
                      known_hosts=kh)
    return {n: SshTarget(name=n, address="127.0.0.1", user="root", port=node_port or site.node.port,
                         key=site.client_file, known_hosts=kh, jump=jump) for n in names}


def test_a_command_runs_on_the_node_through_the_bastion(site: Site) -> None:
    with SshRemote(_targets(site, ("node1", "node2"))) as remote:
        done = remote.run("node1", ["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=10)
        assert done == (3, "out\n", "err\n")
        many = remote.run_many({"node1": ["echo", "one"], "node2": ["echo", "two"]}, timeout=10)
        assert (many["node1"].stdout, many["node2"].stdout) == ("one\n", "two\n")
    # the node's SSH ran inside channels the bastion opened to it; the bastion ran nothing itself
    assert site.bastion.log.forwards == [("127.0.0.1", site.node.port)] * 2
    assert site.bastion.log.commands == []
    assert site.bastion.log.connections == 1  # one bastion connection for both nodes
    assert site.node.log.connections == 2 and len(site.node.log.commands) == 3


def test_unknown_bastion_key_is_refused_with_its_fingerprint_and_nothing_runs(site: Site, tmp_path: Path) -> None:
    only_node = tmp_path / "known_hosts.node"
    only_node.write_text(f"[127.0.0.1]:{site.node.port} {site.node.host_key.get_name()} "
                         f"{site.node.host_key.get_base64()}\n")
    with SshRemote(_targets(site, ("node1", "node2"), known=only_node)) as remote:
        with pytest.raises(RemoteError) as err:
            remote.run("node1", ["touch", str(tmp_path / "ran")], timeout=5)
        many = remote.run_many({"node1": ["true"], "node2": ["true"]}, timeout=5)
    msg = err.value.message
    assert msg.startswith(f"bastion ops@127.0.0.1:{site.bastion.port}: ") and fingerprint(site.bastion.host_key) in msg
    assert f"[127.0.0.1]:{site.bastion.port} ssh-ed25519 {site.bastion.host_key.get_base64()}" in (err.value.hint or "")
    assert {d.rc for d in many.values()} == {255} and {d.stderr for d in many.values()} == {str(err.value)}
    assert site.bastion.log.forwards == [] and site.node.log.connections == 0
    assert not (tmp_path / "ran").exists()
    assert only_node.read_text().count("\n") == 1  # nothing learnt


def test_changed_bastion_key_is_refused(site: Site, tmp_path: Path) -> None:
    other = paramiko.Ed25519Key.from_private_key_file(keyfile(tmp_path))
    kh = tmp_path / "known_hosts.changed"
    kh.write_text(f"[127.0.0.1]:{site.bastion.port} {other.get_name()} {other.get_base64()}\n")
    with SshRemote(_targets(site, known=kh)) as remote, pytest.raises(RemoteError, match="CHANGED") as err:
        remote.run("node1", ["true"], timeout=5)
    assert err.value.message.startswith("bastion ops@127.0.0.1")
    assert fingerprint(site.bastion.host_key) in err.value.message and fingerprint(other) in err.value.message
    assert "replace-node" not in (err.value.hint or "")  # a node's remedy, not the bastion's
    assert site.node.log.connections == 0


def test_node_key_is_still_checked_behind_the_bastion(site: Site, tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts.bastion"
    kh.write_text(f"[127.0.0.1]:{site.bastion.port} {site.bastion.host_key.get_name()} "
                  f"{site.bastion.host_key.get_base64()}\n")
    with SshRemote(_targets(site, known=kh)) as remote, pytest.raises(RemoteError) as err:
        remote.run("node1", ["true"], timeout=5)
    assert err.value.message.startswith(f"node1 ([127.0.0.1]:{site.node.port}): host key ")
    assert fingerprint(site.node.host_key) in err.value.message
    assert "trust-host SPEC node1" in (err.value.hint or "")
    assert site.node.log.commands == []


def test_bastion_down_is_one_clear_reason_for_every_node(site: Site) -> None:
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()  # nothing listens there now: connection refused
    made: list[paramiko.SSHClient] = []

    def factory() -> paramiko.SSHClient:
        made.append(paramiko.SSHClient())
        return made[-1]

    nodes = ("gpu01", "gpu02", "gpu03")
    remote = reach.ReachableRemote(SshRemote(_targets(site, nodes, bastion_port=port), client_factory=factory))
    remote.probe(nodes, timeout=5)
    assert len(made) == 1  # the bastion was tried once, not once per node
    reasons = set(remote.lost.values())
    assert sorted(remote.lost) == list(nodes) and len(reasons) == 1
    [why] = reasons
    assert why.startswith(f"bastion ops@127.0.0.1:{port}: cannot connect: ") and "\n" not in why
    results = reach.settle([], remote.lost)
    assert [(r.name, r.node, r.ran, r.error) for r in results] == [("ssh", n, False, why) for n in nodes]
    assert site.node.log.connections == 0


def test_a_node_the_bastion_cannot_reach_is_named_and_the_others_still_run(site: Site) -> None:
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()
    targets = {**_targets(site, ("good",)), **_targets(site, ("gone",), node_port=port)}
    with SshRemote(targets) as remote:
        many = remote.run_many({"good": ["echo", "ok"], "gone": ["true"]}, timeout=5)
    assert many["good"].stdout == "ok\n"
    assert many["gone"].unreachable
    assert many["gone"].stderr.startswith(f"gone (127.0.0.1:{port}): bastion ops@127.0.0.1:{site.bastion.port} "
                                          "cannot reach it: ")


def test_targets_from_a_spec_with_a_jump_host(tmp_path: Path) -> None:
    from provisioner.remote import targets_from_cluster
    from provisioner.spec import load_text

    root = Path(__file__).resolve().parents[2]
    text = (root / "examples" / "h100-ndr-8node.yaml").read_text()
    old = "ssh: {user: root, key: ~/.ssh/id_ed25519, known_hosts: known_hosts}"
    assert old in text
    spec = tmp_path / "cluster.yaml"
    spec.write_text(text.replace(old, "ssh: {user: root, known_hosts: kh, jump: {host: bastion.example.com}}"))
    res = load_text(spec.read_text(), str(spec))
    assert res.cluster is not None, [d.format() for d in res.errors]
    targets = targets_from_cluster(res.cluster)
    jumps = {t.jump for t in targets.values()}
    assert jumps == {JumpTarget(host="bastion.example.com", user="root", port=22, key=None,
                                known_hosts=tmp_path / "kh")}  # user defaults to ssh.user; one bastion for all


def test_a_node_key_is_read_through_the_bastion_never_by_dialling_the_node(site: Site) -> None:
    """trust-host and replace-node read the key a node offers inside a direct-tcpip channel of the bastion's
    connection: the node's address is only meaningful behind the bastion."""
    from provisioner.hostkeys import KeyReader, fetch_host_key

    [target] = _targets(site).values()
    assert fingerprint(fetch_host_key(target)) == fingerprint(site.node.host_key)
    assert site.bastion.log.forwards == [("127.0.0.1", site.node.port)] and site.bastion.log.connections == 1
    two = _targets(site, ("gpu01", "gpu02"))
    with KeyReader() as reader:
        offered = {n: fingerprint(reader(t)) for n, t in two.items()}
    assert offered == {"gpu01": fingerprint(site.node.host_key), "gpu02": fingerprint(site.node.host_key)}
    assert site.bastion.log.connections == 2  # one more bastion connection, shared by both reads
    assert len(site.bastion.log.forwards) == 3 and site.node.log.connections == 3
    assert site.node.log.commands == []  # a key exchange only: nothing authenticated, nothing run


def _node_unknown(site: Site, tmp_path: Path) -> Path:
    """known_hosts that trusts the bastion only (a new node behind it)."""
    kh = tmp_path / "known_hosts.bastion"
    kh.write_text(f"[127.0.0.1]:{site.bastion.port} {site.bastion.host_key.get_name()} "
                  f"{site.bastion.host_key.get_base64()}\n")
    return kh


def test_trust_host_through_the_bastion_records_a_matching_key(site: Site, tmp_path: Path) -> None:
    from provisioner.hostkeys import recorded_host_keys
    from provisioner.trust import trust_hosts

    targets = _targets(site, known=_node_unknown(site, tmp_path))
    offered = fingerprint(site.node.host_key)
    [r] = trust_hosts(targets, ["node1"], {"node1": offered})
    assert (r.status, r.offered) == ("trusted", offered)
    assert [fingerprint(k) for k in recorded_host_keys(targets["node1"])] == [offered]
    assert site.bastion.log.forwards == [("127.0.0.1", site.node.port)]
    with SshRemote(targets) as remote:  # and verification through the bastion now accepts the node
        assert remote.run("node1", ["echo", "ok"], timeout=10).stdout == "ok\n"


def test_trust_host_through_the_bastion_refuses_a_mismatch_naming_both(site: Site, tmp_path: Path) -> None:
    from provisioner.trust import trust_hosts

    kh = _node_unknown(site, tmp_path)
    before = kh.read_text()
    other = fingerprint(paramiko.Ed25519Key.from_private_key_file(keyfile(tmp_path)))
    [r] = trust_hosts(_targets(site, known=kh), ["node1"], {"node1": other})
    assert r.status == "refused"
    assert f"node1 offers host key {fingerprint(site.node.host_key)}, not the {other} you gave" in r.detail
    assert kh.read_text() == before


def test_trust_host_through_an_unknown_bastion_contacts_no_node(site: Site, tmp_path: Path) -> None:
    from provisioner.trust import trust_hosts

    kh = tmp_path / "known_hosts.empty"
    kh.write_text("")
    targets = _targets(site, ("gpu01", "gpu02"), known=kh)
    results = trust_hosts(targets, ["gpu01", "gpu02"], {n: fingerprint(site.node.host_key) for n in targets})
    assert [r.status for r in results] == ["unreachable", "unreachable"]
    assert len({r.detail for r in results}) == 1  # the bastion is tried once; both nodes get its reason
    assert results[0].detail.startswith(f"bastion ops@127.0.0.1:{site.bastion.port}: host key ")
    assert fingerprint(site.bastion.host_key) in results[0].detail
    assert site.bastion.log.connections == 1 and site.bastion.log.forwards == [] and site.node.log.connections == 0
    assert kh.read_text() == ""


def test_trust_host_cli_with_a_spec_behind_the_bastion(site: Site, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from provisioner.cli import main

    from .test_replace import SPEC

    spec = tmp_path / "cluster.yaml"
    spec.write_text(SPEC.replace('"127.0.0.[11-14]"', '"127.0.0.[1-4]"').replace(
        "ssh: {user: root, known_hosts: known_hosts}",
        f"ssh: {{user: root, known_hosts: kh, key: {site.client_file}, port: {site.node.port}, "
        f"jump: {{host: 127.0.0.1, user: ops, port: {site.bastion.port}}}}}"))
    kh = _node_unknown(site, tmp_path)
    kh.rename(tmp_path / "kh")
    offered = fingerprint(site.node.host_key)
    wrong = fingerprint(paramiko.Ed25519Key.from_private_key_file(keyfile(tmp_path)))
    state = str(tmp_path / "state")
    assert main(["trust-host", str(spec), "gpu01", "--fingerprint", wrong, "--out", state]) == 2
    assert f"gpu01 offers host key {offered}, not the {wrong} you gave" in capsys.readouterr().out
    assert main(["trust-host", str(spec), "gpu01", "--fingerprint", offered, "--out", state]) == 0
    assert f"gpu01: trusted: {offered}" in capsys.readouterr().out
    assert (tmp_path / "kh").read_text().splitlines()[-1] == (
        f"gpu01,[127.0.0.1]:{site.node.port} ssh-ed25519 {site.node.host_key.get_base64()}")
    assert site.bastion.log.forwards == [("127.0.0.1", site.node.port)] * 2 and site.node.log.commands == []


def test_replace_node_reads_the_new_key_through_the_bastion(site: Site, tmp_path: Path) -> None:
    from provisioner.day2.replace import trust_new_key
    from provisioner.hostkeys import recorded_host_keys

    kh = _node_unknown(site, tmp_path)
    old = paramiko.Ed25519Key.from_private_key_file(keyfile(tmp_path))
    with kh.open("a") as f:  # the node's key before it was swapped
        f.write(f"node1,[127.0.0.1]:{site.node.port} {old.get_name()} {old.get_base64()}\n")
    [target] = _targets(site, known=kh).values()
    new = fingerprint(site.node.host_key)
    verdict = trust_new_key(target, tmp_path / "state", accept_new=False, expected=new, progress=lambda _m: None)
    assert verdict.action == "replace" and verdict.known == (fingerprint(old),)
    assert [fingerprint(k) for k in recorded_host_keys(target)] == [new]
    assert site.bastion.log.forwards == [("127.0.0.1", site.node.port)]
