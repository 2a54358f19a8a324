"""provision trust-host: a key is recorded only when the node offers the fingerprint the operator vouched for."""

from __future__ import annotations

from pathlib import Path

import paramiko
import pytest

from provisioner.errors import RemoteError, UsageError
from provisioner.hostkeys import fingerprint, recorded_host_keys
from provisioner.remote import SshTarget
from provisioner.trust import parse_fingerprints, trust_hosts


@pytest.fixture(scope="module")
def keys() -> dict[str, paramiko.PKey]:
    return {name: paramiko.RSAKey.generate(1024) for name in ("gpu01", "gpu02", "other")}


def _targets(tmp_path: Path) -> dict[str, SshTarget]:
    kh = tmp_path / "ssh" / "known_hosts"
    return {n: SshTarget(name=n, address=f"10.0.0.{i}", user="root", port=22, key=None, known_hosts=kh)
            for i, n in enumerate(("gpu01", "gpu02"), 1)}


def _fetch(offers: dict[str, paramiko.PKey | None]):  # type: ignore[no-untyped-def]
    def fetch(target: SshTarget) -> paramiko.PKey:
        key = offers[target.name]
        if key is None:
            raise RemoteError(f"{target.name} ({target.address}:22): timed out")
        return key
    return fetch


def test_matching_fingerprint_is_recorded_and_nothing_else(tmp_path: Path, keys: dict[str, paramiko.PKey]) -> None:
    targets = _targets(tmp_path)
    offers = {"gpu01": keys["gpu01"], "gpu02": keys["gpu02"]}
    results = trust_hosts(targets, ["gpu01", "gpu02"], {"gpu01": fingerprint(keys["gpu01"])}, fetch=_fetch(offers))
    assert [(r.node, r.status) for r in results] == [("gpu01", "trusted"), ("gpu02", "refused")]
    assert results[1].offered == fingerprint(keys["gpu02"]) and "--fingerprint" in results[1].detail
    assert [fingerprint(k) for k in recorded_host_keys(targets["gpu01"])] == [fingerprint(keys["gpu01"])]
    assert recorded_host_keys(targets["gpu02"]) == []
    again = trust_hosts(targets, ["gpu01"], {}, fetch=_fetch(offers))
    assert again[0].status == "known"
    assert len(targets["gpu01"].known_hosts.read_text().splitlines()) == 1


def test_wrong_fingerprint_writes_nothing(tmp_path: Path, keys: dict[str, paramiko.PKey]) -> None:
    targets = _targets(tmp_path)
    [r] = trust_hosts(targets, ["gpu01"], {"gpu01": fingerprint(keys["other"])},
                      fetch=_fetch({"gpu01": keys["gpu01"]}))
    assert r.status == "refused" and "in the middle" in r.detail
    assert not targets["gpu01"].known_hosts.exists()


def test_a_changed_key_is_sent_to_replace_node(tmp_path: Path, keys: dict[str, paramiko.PKey]) -> None:
    targets = _targets(tmp_path)
    trust_hosts(targets, ["gpu01"], {"gpu01": fingerprint(keys["gpu01"])}, fetch=_fetch({"gpu01": keys["gpu01"]}))
    [r] = trust_hosts(targets, ["gpu01"], {"gpu01": fingerprint(keys["other"])},
                      fetch=_fetch({"gpu01": keys["other"]}))
    assert r.status == "refused" and "replace-node" in r.detail
    assert [fingerprint(k) for k in recorded_host_keys(targets["gpu01"])] == [fingerprint(keys["gpu01"])]


def test_unreachable_node_is_reported_not_raised(tmp_path: Path) -> None:
    [r] = trust_hosts(_targets(tmp_path), ["gpu02"], {}, fetch=_fetch({"gpu02": None}))
    assert r.status == "unreachable" and "timed out" in r.detail


def test_fingerprint_file(keys: dict[str, paramiko.PKey]) -> None:
    fp = fingerprint(keys["gpu01"])
    assert parse_fingerprints(f"# rack 4\ngpu01 {fp}\n\n", "fp.txt") == {"gpu01": fp}
    with pytest.raises(UsageError, match=r"fp.txt:2: .* not a SHA256"):
        parse_fingerprints(f"gpu01 {fp}\ngpu02 MD5:aa:bb\n", "fp.txt")
    with pytest.raises(UsageError, match=r"fp.txt:2: gpu01 is listed twice"):
        parse_fingerprints(f"gpu01 {fp}\ngpu01 {fp}\n", "fp.txt")
    with pytest.raises(UsageError, match=r"fp.txt:1: expected"):
        parse_fingerprints("gpu01\n", "fp.txt")


def test_fingerprints_for_unknown_nodes_are_refused(tmp_path: Path, keys: dict[str, paramiko.PKey]) -> None:
    with pytest.raises(UsageError, match="gpu99"):
        trust_hosts(_targets(tmp_path), ["gpu01"], {"gpu99": fingerprint(keys["gpu01"])}, fetch=_fetch({}))


def test_cli_shows_then_records_against_a_real_ssh_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from provisioner.cli import main
    from provisioner.state import hardware_history

    from .test_replace import SPEC, _KeyServer

    server = _KeyServer(paramiko.ECDSAKey.generate())
    try:
        spec = tmp_path / "cluster.yaml"
        spec.write_text(SPEC.replace('"127.0.0.[11-14]"', '"127.0.0.[1-4]"')
                        .replace("known_hosts: known_hosts}", f"known_hosts: known_hosts, port: {server.port}}}"))
        offered = fingerprint(server.key)
        state = tmp_path / "state"
        assert main(["trust-host", str(spec), "gpu01", "--out", str(state)]) == 2
        assert f"gpu01: refused: {offered}" in capsys.readouterr().out
        assert not (tmp_path / "known_hosts").exists()
        assert main(["trust-host", str(spec), "gpu01", "--fingerprint", offered, "--out", str(state)]) == 0
        assert "gpu01: trusted" in capsys.readouterr().out
        assert f"[127.0.0.1]:{server.port}" in (tmp_path / "known_hosts").read_text()
        assert [(c.kind, c.new) for c in hardware_history(state, "gpu01")] == [("host_key", offered)]
        assert main(["trust-host", str(spec), "gpu[01-02]", "--fingerprint", offered]) == 2
        assert "--fingerprints FILE" in capsys.readouterr().err
    finally:
        server.close()


def test_400_appends_from_16_processes_at_once_all_land(tmp_path: Path, keys: dict[str, paramiko.PKey]) -> None:
    """known_hosts is read, decided on and rewritten under its own lock: concurrent trust-host runs (a rack's
    worth each, at once) keep every line (without the lock 194 of 400 were lost)."""
    import multiprocessing

    kh = tmp_path / "ssh" / "known_hosts"
    names = [f"gpu{i:03d}" for i in range(1, 401)]
    targets = {n: SshTarget(name=n, address=f"10.1.{i // 250}.{i % 250}", user="root", port=22, key=None,
                            known_hosts=kh) for i, n in enumerate(names)}
    key = keys["gpu01"]
    ctx = multiprocessing.get_context("fork")
    start = ctx.Barrier(16)

    def rack(chunk: list[str]) -> None:
        start.wait(30)
        results = trust_hosts(targets, chunk, dict.fromkeys(chunk, fingerprint(key)), fetch=lambda _t: key)
        raise SystemExit(0 if all(r.status == "trusted" for r in results) else 3)

    procs = [ctx.Process(target=rack, args=(names[i::16],)) for i in range(16)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
    assert [proc.exitcode for proc in procs] == [0] * 16
    lines = kh.read_text(encoding="utf-8").splitlines()
    assert sorted(ln.split(",", 1)[0] for ln in lines) == names
    assert all(recorded_host_keys(targets[n]) for n in ("gpu001", "gpu200", "gpu400"))
