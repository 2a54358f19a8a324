"""vendor_repos' apt_keyring module: the key format comes from the content, never the file name.

Keys are made by gpg itself (armored and binary exports of one key), so the dearmoring is checked against
gpg's own output; the module runs as Ansible runs it (a JSON args file) for the write/idempotence paths.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

MODULE_PATH = Path(__file__).resolve().parents[2] / "roles/vendor_repos/library/apt_keyring.py"

pytestmark = pytest.mark.skipif(shutil.which("gpg") is None, reason="needs gpg")


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("apt_keyring", MODULE_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ak = _module()


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """One ed25519 key exported by gpg: public armored/binary, and the secret key armored."""
    home = tmp_path_factory.mktemp("gnupg")
    home.chmod(0o700)
    env = {**os.environ, "GNUPGHOME": str(home)}

    def gpg(*args: str) -> bytes:
        return subprocess.run(["gpg", "--batch", "--pinentry-mode", "loopback", "--passphrase", "", *args],
                              env=env, capture_output=True, check=True).stdout

    try:
        gpg("--quick-gen-key", "test vendor <vendor@example.invalid>", "ed25519", "sign", "never")
        out = {"binary": gpg("--export"), "armored": gpg("--armor", "--export"),
               "secret": gpg("--armor", "--export-secret-keys")}
    finally:
        subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=env, check=False)
    return out


def test_armored_key_is_dearmored_to_exactly_what_gpg_exports(exports: dict[str, bytes]) -> None:
    keyring, kind = ak.keyring_from(exports["armored"], "3bf863cc.pub")
    assert (kind, keyring) == ("armored", exports["binary"])


def test_armor_headers_crlf_and_a_leading_blank_do_not_matter(exports: dict[str, bytes]) -> None:
    lines = exports["armored"].decode().splitlines()
    assert lines[0] == "-----BEGIN PGP PUBLIC KEY BLOCK-----"
    # NVIDIA's 3bf863cc.pub carries a "Version: GnuPG v2.0.22 (GNU/Linux)" header; Windows-edited copies have CRLF.
    edited = "\r\n".join(["", lines[0], "Version: GnuPG v2.0.22 (GNU/Linux)", *lines[1:]]) + "\r\n"
    assert ak.keyring_from(edited.encode(), "k") == (exports["binary"], "armored")


def test_binary_key_passes_unchanged_whatever_its_name(exports: dict[str, bytes]) -> None:
    # Sites keep dearmored copies under the vendor's .pub name (`gpg --dearmor > GPG-KEY-Mellanox.pub`).
    assert ak.keyring_from(exports["binary"], "GPG-KEY-Mellanox.pub") == (exports["binary"], "binary")


def test_damaged_armor_is_refused_with_the_reason(exports: dict[str, bytes]) -> None:
    text = exports["armored"].decode()
    lines = text.splitlines()
    body = next(i for i, line in enumerate(lines) if len(line) > 40)
    flipped = lines[body][:10] + ("A" if lines[body][10] != "A" else "B") + lines[body][11:]
    damaged = "\n".join([*lines[:body], flipped, *lines[body + 1:]]).encode()
    with pytest.raises(ak.KeyError_, match="CRC-24"):
        ak.keyring_from(damaged, "cuda.pub")
    truncated = "\n".join(lines[:-1]).encode()
    with pytest.raises(ak.KeyError_, match="truncated"):
        ak.keyring_from(truncated, "cuda.pub")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"<html><body>404 Not Found</body></html>\n", r"cuda\.pub: not an OpenPGP public key \(text\)"),
        (b"", r"not an OpenPGP public key \(empty\)"),
        (b"-----BEGIN PGP SIGNATURE-----\n\nabc\n-----END PGP SIGNATURE-----\n", "PGP SIGNATURE.* is not a public key"),
    ],
)
def test_what_is_no_public_key_is_refused(content: bytes, message: str) -> None:
    with pytest.raises(ak.KeyError_, match=message):
        ak.keyring_from(content, "cuda.pub")


def test_a_secret_key_is_never_installed(exports: dict[str, bytes]) -> None:
    with pytest.raises(ak.KeyError_, match=r"PRIVATE KEY BLOCK.* is not a public key"):
        ak.keyring_from(exports["secret"], "oops.pub")


def _run(tmp: Path, args: dict[str, object]) -> dict[str, object]:
    argfile = tmp / "args.json"
    argfile.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    done = subprocess.run([sys.executable, str(MODULE_PATH), str(argfile)], capture_output=True, text=True,
                          check=False)
    return dict(json.loads(done.stdout))


def test_module_writes_once_then_reports_no_change(exports: dict[str, bytes], tmp_path: Path) -> None:
    src, dest = tmp_path / "provisioner-cuda.key", tmp_path / "provisioner-cuda.gpg"
    src.write_bytes(exports["armored"])
    checked = _run(tmp_path, {"src": str(src), "dest": str(dest), "_ansible_check_mode": True})
    assert checked["changed"] is True and not dest.exists()  # check mode writes nothing
    first = _run(tmp_path, {"src": str(src), "dest": str(dest)})
    assert (first["changed"], first["format"]) == (True, "armored")
    assert dest.read_bytes() == exports["binary"] and (dest.stat().st_mode & 0o777) == 0o644
    assert _run(tmp_path, {"src": str(src), "dest": str(dest)})["changed"] is False
    src.write_bytes(b"not a key\n")
    failed = _run(tmp_path, {"src": str(src), "dest": str(dest)})
    assert failed.get("failed") is True and "not an OpenPGP public key" in str(failed["msg"])
    assert dest.read_bytes() == exports["binary"]  # a bad key never replaces a good keyring
