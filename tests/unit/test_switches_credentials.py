"""Switch credentials: private files only, ansible-vault decryption, and a Secret that never prints itself."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from ansible.parsing.vault import VaultLib, VaultSecret

from provisioner.errors import UsageError
from provisioner.spec.models import Credentials
from provisioner.switches.credentials import (
    MASK,
    Secret,
    load_credentials,
    read_credentials_file,
    read_vault_file,
)

PASSWORD = "Tr0ub4dor-&-3-xyzzy"


def _write(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def make_vault(tmp_path: Path, plaintext: str, vault_password: str = "vault-pass-1") -> tuple[Path, Path]:
    blob = VaultLib([("default", VaultSecret(vault_password.encode()))]).encrypt(plaintext.encode())
    vault = tmp_path / "switches.vault.yml"
    vault.write_bytes(blob)
    pw = _write(tmp_path / ".vault-pass", vault_password + "\n")
    return vault, pw


def test_secret_is_masked_everywhere() -> None:
    s = Secret(PASSWORD)
    for shown in (str(s), repr(s), f"{s}", f"{s!r}", f"{s:>20}", str([s]), str({"p": s})):
        assert PASSWORD not in shown
        assert MASK in shown
    assert s.reveal() == PASSWORD
    with pytest.raises(TypeError):
        pickle.dumps(s)


def test_credentials_file_0600_is_read(tmp_path: Path) -> None:
    f = _write(tmp_path / "sw.yml", f"username: admin\npassword: '{PASSWORD}'\n")
    creds = read_credentials_file(f)
    assert creds.username == "admin"
    assert creds.password.reveal() == PASSWORD
    assert PASSWORD not in repr(creds)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_credentials_file_readable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    f = _write(tmp_path / "sw.yml", f"username: admin\npassword: '{PASSWORD}'\n", mode)
    with pytest.raises(UsageError, match="accessible by group/others") as exc:
        read_credentials_file(f)
    assert "chmod 600" in str(exc.value)
    assert PASSWORD not in str(exc.value)


def test_credentials_file_missing_and_malformed(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        read_credentials_file(tmp_path / "nope.yml")
    bad = _write(tmp_path / "bad.yml", f"username: admin\npassword: [{PASSWORD}\n")
    with pytest.raises(UsageError, match="not valid YAML") as exc:
        read_credentials_file(bad)
    assert PASSWORD not in str(exc.value)
    nopw = _write(tmp_path / "nopw.yml", "username: admin\n")
    with pytest.raises(UsageError, match="password"):
        read_credentials_file(nopw)
    extra = _write(tmp_path / "extra.yml", f"username: admin\npassword: x\nenable: '{PASSWORD}'\n")
    with pytest.raises(UsageError, match="unknown key") as exc:
        read_credentials_file(extra)
    assert PASSWORD not in str(exc.value)


def test_vault_is_decrypted_with_vaultlib(tmp_path: Path) -> None:
    vault, pw = make_vault(tmp_path, f"username: netops\npassword: '{PASSWORD}'\n")
    assert PASSWORD.encode() not in vault.read_bytes()
    creds = read_vault_file(vault, pw)
    assert creds.username == "netops"
    assert creds.password.reveal() == PASSWORD


def test_vault_wrong_password_is_a_clear_error(tmp_path: Path) -> None:
    vault, _ = make_vault(tmp_path, f"username: netops\npassword: '{PASSWORD}'\n")
    wrong = _write(tmp_path / "wrong-pass", "not-the-password\n")
    with pytest.raises(UsageError, match="cannot decrypt") as exc:
        read_vault_file(vault, wrong)
    assert PASSWORD not in str(exc.value)


def test_vault_password_file_must_be_private(tmp_path: Path) -> None:
    vault, pw = make_vault(tmp_path, "username: a\npassword: b\n")
    pw.chmod(0o644)
    with pytest.raises(UsageError, match="vault password file"):
        read_vault_file(vault, pw)


def test_plain_file_given_as_vault_is_refused(tmp_path: Path) -> None:
    plain = _write(tmp_path / "plain.yml", "username: a\npassword: b\n")
    pw = _write(tmp_path / ".vault-pass", "x\n")
    with pytest.raises(UsageError, match="not an ansible-vault file"):
        read_vault_file(plain, pw)


def test_load_credentials_resolves_relative_to_spec_dir(tmp_path: Path) -> None:
    (tmp_path / "secrets").mkdir()
    _write(tmp_path / "secrets" / "sw.yml", f"username: admin\npassword: '{PASSWORD}'\n")
    creds = load_credentials(Credentials(file="secrets/sw.yml"), tmp_path)
    assert creds.password.reveal() == PASSWORD
    make_vault(tmp_path / "secrets", f"username: v\npassword: '{PASSWORD}'\n")
    creds = load_credentials(Credentials(vault="secrets/switches.vault.yml",
                                         vault_password_file="secrets/.vault-pass"), tmp_path)
    assert creds.username == "v"
    with pytest.raises(UsageError, match="vault_password_file"):
        load_credentials(Credentials(vault="secrets/switches.vault.yml"), tmp_path)


def test_huge_credential_files_are_refused_before_reading(tmp_path: Path) -> None:
    """Issue #26 item 5: the size was checked after reading the whole file (64 GiB of a sparse file: MemoryError)."""
    big = tmp_path / "creds.yml"
    with big.open("wb") as fh:
        fh.truncate(1 << 36)
    big.chmod(0o600)
    with pytest.raises(UsageError, match=r"creds\.yml: 68719476736 bytes is too large for a credentials file"):
        read_credentials_file(big)
    vault, pw = make_vault(tmp_path, "username: netops\npassword: x\n")
    with vault.open("r+b") as fh:
        fh.truncate(1 << 36)
    with pytest.raises(UsageError, match="too large for a vault file"):
        read_vault_file(vault, pw)
