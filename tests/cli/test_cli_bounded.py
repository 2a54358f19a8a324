"""Issue #26 item 5 at the command line: every file the user names is read bounded, a pipe or a device is refused
instead of hanging, and a bad one is one line with exit 2 (never a traceback or exit 3)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.cli import main
from provisioner.userfile import MAX_USER_FILE_BYTES

ROOT = Path(__file__).resolve().parents[2]
H100 = ROOT / "examples" / "h100-ndr-8node.yaml"
GUARD_S = 60  # the old code blocked for ever on a FIFO; the new one answers in about a second


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    rc = main(list(args))
    cap = capsys.readouterr()
    return rc, cap.out + cap.err


def one_line(text: str) -> str:
    assert "Traceback" not in text and "internal error" not in text, text
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1, text
    return lines[0]


def run_guarded(*args: str, cwd: Path, fifo: Path) -> tuple[int, str]:
    """`provision ARGS` in a child with a timeout: a hang fails the test instead of blocking the suite. On a hang
    the FIFO gets a writer that closes at once, so whatever waits on it (ansible-playbook, in a session of its
    own that killing the child would not reach) reads end-of-file and ends."""
    try:
        cp = subprocess.run([sys.executable, "-m", "provisioner.cli", *args], cwd=cwd, capture_output=True,
                            text=True, timeout=GUARD_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail(f"provision {' '.join(args)} hung on a FIFO for {GUARD_S} s")
    return cp.returncode, cp.stdout + cp.stderr


def test_validate_a_directory_names_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, text = run(capsys, "validate", str(tmp_path))  # old: "provision: error: 3: Is a directory" (the fd)
    assert rc == 2
    assert one_line(text) == f"provision: error: {tmp_path}: is a directory, expected a spec file"


def test_parse_refuses_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "out.txt"
    os.mkfifo(fifo)
    rc, text = run_guarded("parse", "ibstat", str(fifo), cwd=tmp_path, fifo=fifo)
    assert rc == 2
    assert f"{fifo}: not a regular file" in one_line(text)


def test_parse_refuses_an_oversize_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    big = tmp_path / "ibstat.txt"
    with big.open("wb") as fh:  # sparse: 64 GiB by its size, nothing on disk (the old reader read it all)
        fh.truncate(1 << 36)
    rc, text = run(capsys, "parse", "ibstat", str(big))
    assert rc == 2
    line = one_line(text)
    assert f"{big}: {1 << 36} bytes is too large" in line and str(MAX_USER_FILE_BYTES) in line


def test_parse_stdin_is_bounded(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    class Endless:
        def read(self, n: int = -1) -> str:
            if n < 0:
                raise AssertionError("stdin read without a limit")
            return "x" * n

    monkeypatch.setattr(sys, "stdin", Endless())
    rc, text = run(capsys, "parse", "ibstat", "-")
    assert rc == 2 and "standard input: more than" in one_line(text)


def test_fingerprints_not_utf8_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    fp = tmp_path / "fp.txt"
    fp.write_bytes(b"gpu01 SHA256:\xff\xfe\n")
    rc, text = run(capsys, "trust-host", str(H100), "gpu01", "--fingerprints", str(fp))  # old: exit 3
    assert rc == 2
    assert one_line(text).startswith(f"provision: error: {fp}: not UTF-8 text (byte 13)")


def test_fingerprints_fifo_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "fp.txt"
    os.mkfifo(fifo)
    rc, text = run_guarded("trust-host", str(H100), "gpu01", "--fingerprints", str(fifo), cwd=tmp_path, fifo=fifo)
    assert rc == 2
    assert f"{fifo}: not a regular file" in one_line(text)


def test_fingerprints_oversize_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    fp = tmp_path / "fp.txt"
    with fp.open("wb") as fh:
        fh.truncate(MAX_USER_FILE_BYTES + 1)
    rc, text = run(capsys, "trust-host", str(H100), "gpu01", "--fingerprints", str(fp))
    assert rc == 2 and "too large for a fingerprints file" in one_line(text)


def test_secrets_fifo_is_refused_before_the_run(tmp_path: Path) -> None:
    fifo = tmp_path / "secrets.yml"
    os.mkfifo(fifo)
    rc, text = run_guarded("up", str(H100), "--secrets", str(fifo), "--out", str(tmp_path / "state"), cwd=tmp_path,
                           fifo=fifo)
    assert rc == 2
    assert f"{fifo}: not a regular file" in one_line(text)
    assert not (tmp_path / "state" / "runs").exists()  # refused before a journal was opened


def test_vault_password_fifo_is_refused_before_the_run(tmp_path: Path) -> None:
    """ansible-playbook would wait on the FIFO for ever; the nodes are on loopback port 1 (refused) in case the old
    code got as far as a playbook."""
    import json

    addresses = {"gpu01": "127.0.0.11", "gpu02": "127.0.0.12", "gpu03": "127.0.0.13", "sm1": "127.0.0.21",
                 "sm2": "127.0.0.22"}
    (tmp_path / "known_hosts").write_text("")
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("ssh: {port: 1, known_hosts: known_hosts}\naddresses: " + json.dumps(addresses) + "\n")
    fifo = tmp_path / "vault-pass"
    os.mkfifo(fifo)
    rc, text = run_guarded("up", str(ROOT / "examples" / "lab" / "cluster.yaml"), "--overlay", str(overlay),
                           "--vault-password-file", str(fifo), "--out", str(tmp_path / "state"), cwd=tmp_path,
                           fifo=fifo)
    assert rc == 2, text
    assert f"{fifo}: not a regular file" in one_line(text)
    assert not (tmp_path / "state" / "runs").exists()
