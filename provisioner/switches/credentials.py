"""Switch login credentials from a 0600 YAML file or an ansible-vault file, held in a masked `Secret`.

The spec never holds a secret (the loader refuses inline passwords); it names where the secret lives. The
password is wrapped in `Secret` the moment it is read, so a stray log line, f-string, repr() or exception shows
a mask, never the value. Only `Secret.reveal()` gives it out, and only the session code calls it, when it hands
the password to netmiko.
"""

from __future__ import annotations

import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import yaml

from provisioner.errors import UsageError
from provisioner.spec.models import Credentials
from provisioner.userfile import read_user_bytes

MASK = "********"
_USERNAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.@-]{0,63}$")
MAX_FILE_BYTES = 64 * 1024


class Secret:
    """A string that never prints itself: str/repr/format show a mask; reveal() is the only way out."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret({MASK!r})"

    def __str__(self) -> str:
        return MASK

    def __format__(self, spec: str) -> str:
        return MASK

    def __reduce__(self) -> NoReturn:
        raise TypeError("a Secret cannot be pickled")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", len(self._value)))


@dataclass(frozen=True)
class SwitchCredentials:
    username: str
    password: Secret
    source: str  # the file it came from, for messages


def _check_private(path: Path, what: str) -> None:
    """Refuse a secret file that group or others can read or write: a shared secret is a leaked secret."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise UsageError(f"{what} {path} does not exist", hint="create it with mode 0600") from None
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{what} {path} is not a regular file")
    if st.st_mode & 0o077:
        raise UsageError(f"{what} {path} is accessible by group/others (mode {stat.S_IMODE(st.st_mode):04o})",
                         hint=f"run: chmod 600 {path}")


def _read_bytes(path: Path, what: str) -> bytes:
    return read_user_bytes(path, f"a {what}", limit=MAX_FILE_BYTES)  # size and type checked before reading


def _from_mapping(data: Any, source: Path) -> SwitchCredentials:
    """username/password from parsed YAML; errors name the file and the key, never a value."""
    if not isinstance(data, dict):
        raise UsageError(f"{source}: expected a mapping with `username` and `password`")
    user = data.get("username")
    pw = data.get("password")
    if not isinstance(user, str) or not _USERNAME.match(user):
        raise UsageError(f"{source}: `username` is missing or not a plain user name",
                         hint="username: admin")
    if not isinstance(pw, str) or not pw:
        raise UsageError(f"{source}: `password` is missing or not a string", hint="quote the password")
    unknown = sorted(str(k) for k in data if k not in ("username", "password"))
    if unknown:
        raise UsageError(f"{source}: unknown key(s) {', '.join(unknown)}", hint="only username and password")
    return SwitchCredentials(username=user, password=Secret(pw), source=str(source))


def _parse_yaml(text: str, source: Path) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        # the parser's message quotes the offending line, which may be the password: say only where
        raise UsageError(f"{source}: not valid YAML", hint="expected `username: ...` and `password: ...`") from None


def read_credentials_file(path: Path) -> SwitchCredentials:
    """A plain YAML credentials file, which must be private to its owner (mode 0600 or stricter)."""
    _check_private(path, "credentials file")
    try:
        text = _read_bytes(path, "credentials file").decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not UTF-8 text") from None
    return _from_mapping(_parse_yaml(text, path), path)


def read_vault_file(path: Path, password_file: Path) -> SwitchCredentials:
    """An ansible-vault encrypted YAML, decrypted with ansible-core's VaultLib and the vault password file."""
    from ansible.errors import AnsibleError
    from ansible.parsing.vault import VaultLib, VaultSecret, is_encrypted

    _check_private(password_file, "vault password file")
    if not path.is_file():
        raise UsageError(f"vault file {path} does not exist", hint="create it with ansible-vault create")
    vault_pw = _read_bytes(password_file, "vault password file").strip()
    if not vault_pw:
        raise UsageError(f"vault password file {password_file} is empty")
    blob = _read_bytes(path, "vault file")
    if not is_encrypted(blob):
        raise UsageError(f"{path} is not an ansible-vault file", hint="encrypt it: ansible-vault encrypt " + str(path))
    try:
        plain = VaultLib([("default", VaultSecret(vault_pw))]).decrypt(blob)
    except AnsibleError:
        raise UsageError(f"cannot decrypt {path} with {password_file}",
                         hint="wrong vault password, or the file was encrypted with another vault id") from None
    try:
        text = plain.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{path}: decrypted content is not UTF-8 text") from None
    return _from_mapping(_parse_yaml(text, path), path)


def load_credentials(creds: Credentials, base_dir: Path) -> SwitchCredentials:
    """Credentials as the spec names them; relative paths are relative to the spec file's directory."""

    def resolve(p: str) -> Path:
        q = Path(p).expanduser()
        return q if q.is_absolute() else base_dir / q

    if creds.file is not None:
        return read_credentials_file(resolve(creds.file))
    if creds.vault is None:
        raise UsageError("credentials give neither `file` nor `vault`")
    if creds.vault_password_file is None:
        raise UsageError(f"credentials vault {creds.vault} needs `vault_password_file`",
                         hint="secrets never come from environment variables or prompts here")
    return read_vault_file(resolve(creds.vault), resolve(creds.vault_password_file))
