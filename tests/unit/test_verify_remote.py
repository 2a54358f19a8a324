"""provisioner.remote against an in-process paramiko SSH server on 127.0.0.1 (commands run locally via sh)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from provisioner.errors import RemoteError, UsageError
from provisioner.hostkeys import fingerprint
from provisioner.remote import SshRemote, SshTarget, command_line
from tests.unit._ssh_servers import keyfile
from tests.unit._ssh_servers import sshd as node_sshd


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, paramiko.PKey, Path]]:
    client_file = keyfile(tmp_path_factory.mktemp("c"))
    client_key = paramiko.Ed25519Key.from_private_key_file(client_file)
    with node_sshd(tmp_path_factory.mktemp("h"), client_key, bastion=False) as server:
        yield server.port, server.host_key, client_file


def _target(port: int, client_file: Path, known: Path) -> SshTarget:
    return SshTarget(name="node1", address="127.0.0.1", user="root", port=port, key=client_file, known_hosts=known)


def _known(tmp_path: Path, port: int, key: paramiko.PKey, name: str = "127.0.0.1") -> Path:
    path = tmp_path / "known_hosts"
    path.write_text(f"[{name}]:{port} {key.get_name()} {key.get_base64()}\n")
    return path


def test_command_line_quotes_words_and_checks_env_names() -> None:
    line = command_line(["echo", "a b", "$(rm -rf /)"], {"NCCL_TESTS_HOSTS": "a,b"}, 9.2)
    assert line == "env NCCL_TESTS_HOSTS=a,b timeout --kill-after=5 10 echo 'a b' '$(rm -rf /)'"
    with pytest.raises(UsageError):
        command_line(["true"], {"BAD;NAME": "x"})
    with pytest.raises(UsageError):
        command_line([])


def test_run_and_pool_and_parallel(sshd: tuple[int, paramiko.PKey, Path], tmp_path: Path) -> None:
    port, host_key, client_file = sshd
    target = _target(port, client_file, _known(tmp_path, port, host_key))
    with SshRemote({"node1": target}) as remote:
        done = remote.run("node1", ["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=10)
        assert done == (3, "out\n", "err\n")
        assert remote.client("node1") is remote.client("node1")  # pooled
        env = remote.run("node1", ["sh", "-c", "echo $NCCL_TESTS_HOSTS"], timeout=10, env={"NCCL_TESTS_HOSTS": "x,y"})
        assert env.stdout == "x,y\n"
        many = remote.run_many({"node1": ["echo", "hi"], "ghost": ["echo"]}, timeout=10)
        assert many["node1"].stdout == "hi\n" and many["ghost"].unreachable


def test_timeout_returns_124_instead_of_hanging(sshd: tuple[int, paramiko.PKey, Path], tmp_path: Path) -> None:
    port, host_key, client_file = sshd
    with SshRemote({"node1": _target(port, client_file, _known(tmp_path, port, host_key))}) as remote:
        done = remote.run("node1", ["sleep", "30"], timeout=1)
        assert done.timed_out
        bg = remote.start("node1", ["sh", "-c", "echo started; sleep 30"], timeout=60)
        assert bg.wait(timeout=0.5).timed_out
        bg.kill()
        fin = remote.start("node1", ["echo", "server"], timeout=10).wait(timeout=10)
        assert fin.rc == 0 and fin.stdout == "server\n"  # the PID marker line is stripped


def test_unknown_host_key_is_refused_with_its_fingerprint(
    sshd: tuple[int, paramiko.PKey, Path], tmp_path: Path
) -> None:
    port, host_key, client_file = sshd
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with SshRemote({"node1": _target(port, client_file, empty)}) as remote, pytest.raises(RemoteError) as err:
        remote.run("node1", ["true"], timeout=5)
    assert fingerprint(host_key) in err.value.message and "node1" in err.value.message
    assert "trust-host SPEC node1 --fingerprint" in (err.value.hint or "")
    assert empty.read_text() == ""  # nothing learnt


def test_changed_host_key_is_refused(sshd: tuple[int, paramiko.PKey, Path], tmp_path: Path) -> None:
    port, host_key, client_file = sshd
    other = paramiko.Ed25519Key.from_private_key_file(keyfile(tmp_path))
    known = _known(tmp_path, port, other)
    with SshRemote({"node1": _target(port, client_file, known)}) as remote, pytest.raises(
        RemoteError, match="CHANGED"
    ) as err:
        remote.run("node1", ["true"], timeout=5)
    assert fingerprint(host_key) in err.value.message and fingerprint(other) in err.value.message


def test_key_recorded_under_the_node_name_counts_for_its_address(
    sshd: tuple[int, paramiko.PKey, Path], tmp_path: Path
) -> None:
    port, host_key, client_file = sshd
    with SshRemote({"node1": _target(port, client_file, _known(tmp_path, port, host_key, "node1"))}) as remote:
        assert remote.run("node1", ["echo", "ok"], timeout=5).stdout == "ok\n"


def test_missing_known_hosts_file_is_a_clear_error(tmp_path: Path) -> None:
    with SshRemote({"node1": _target(22, tmp_path / "k", tmp_path / "nope")}) as remote, pytest.raises(
        RemoteError, match="does not exist"
    ):
        remote.run("node1", ["true"], timeout=5)


def test_fingerprint_matches_openssh_format() -> None:
    key = paramiko.Ed25519Key.from_private_key_file(keyfile(Path(__import__("tempfile").mkdtemp())))
    fp = fingerprint(key)
    assert fp.startswith("SHA256:") and len(fp) == 7 + 43 and not fp.endswith("=")
