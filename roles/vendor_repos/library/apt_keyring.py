#!/usr/bin/python3
"""Ansible module: turn a vendor's repository key into the binary keyring apt's Signed-By reads.

Why a module: vendors name their keys as they like. NVIDIA serves ASCII-armored keys as
``.pub`` (the CUDA repository's ``3bf863cc.pub``, DOCA's ``GPG-KEY-Mellanox.pub``), sites
often keep a dearmored copy under the same ``.pub`` name, and apt decides how to read a
Signed-By file by its extension (``.asc`` armored, anything else binary). So the format is
read from the content, never from the name: an armored key is dearmored here (RFC 4880
section 6: base64 body, CRC-24 checked), a binary one is taken as it is, and anything else
(a private key, a signature, an HTML error page saved as a key) is refused with one line.
Pure Python: the node needs no gpg.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: apt_keyring
short_description: Write a binary OpenPGP keyring for apt from an armored or binary public key
description:
  - Reads I(src) on the node, detects ASCII armor by content (C(-----BEGIN PGP PUBLIC KEY BLOCK-----)),
    dearmors it, checks that the result starts with a public-key packet and writes I(dest) (mode 0644)
    only when its content differs.
options:
  src:
    description: The key as the site delivered it (armored or binary, any file name).
    type: path
    required: true
  dest:
    description: The binary keyring to write (what Signed-By names).
    type: path
    required: true
author: provisioner
"""

EXAMPLES = r"""
- name: Dearmor the CUDA key when it is armored
  apt_keyring:
    src: /etc/apt/keyrings/provisioner-cuda.key
    dest: /etc/apt/keyrings/provisioner-cuda.gpg
"""

RETURN = r"""
format:
  description: What I(src) held, C(armored) or C(binary).
  type: str
  returned: success
sha256:
  description: SHA-256 of the keyring written to I(dest).
  type: str
  returned: success
"""

import base64  # noqa: E402 - Ansible modules put DOCUMENTATION first
import binascii  # noqa: E402
import hashlib  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

ARMOR_BEGIN = b"-----BEGIN PGP PUBLIC KEY BLOCK-----"
ARMOR_END = b"-----END PGP PUBLIC KEY BLOCK-----"
PUBLIC_KEY_TAG = 6
CRC24_INIT = 0xB704CE
CRC24_POLY = 0x1864CFB


class KeyError_(ValueError):
    """The input is not a usable OpenPGP public key (the message says why)."""


def crc24(data: bytes) -> int:
    """The armor checksum of RFC 4880 section 6.1."""
    crc = CRC24_INIT
    for byte in data:
        crc ^= byte << 16
        for _ in range(8):
            crc <<= 1
            if crc & 0x1000000:
                crc ^= CRC24_POLY
    return crc & 0xFFFFFF


def first_packet_tag(data: bytes) -> int | None:
    """The tag of the first OpenPGP packet, or None when the first byte is no packet header."""
    if not data or not data[0] & 0x80:
        return None
    if data[0] & 0x40:  # new format: tag in the low six bits
        return data[0] & 0x3F
    return (data[0] & 0x3C) >> 2  # old format: tag in bits 5..2


def _dearmor_block(lines: list[bytes], where: str) -> bytes:
    """Body lines of one armored block (between BEGIN and END) to bytes, checksum verified."""
    body: list[bytes] = []
    checksum: bytes | None = None
    for line in (raw.strip() for raw in lines):
        if not line or b":" in line:  # blank separator, or an armor header (Version:, Comment:): no base64
            continue
        if line.startswith(b"=") and len(line) == 5:
            checksum = line[1:]
            break
        body.append(line)
    try:
        data = base64.b64decode(b"".join(body), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise KeyError_(f"{where}: the armored key's base64 body is damaged ({exc})") from exc
    if checksum is not None:
        try:
            want = int.from_bytes(base64.b64decode(checksum, validate=True), "big")
        except (binascii.Error, ValueError) as exc:
            raise KeyError_(f"{where}: the armor checksum line is damaged") from exc
        if crc24(data) != want:
            raise KeyError_(f"{where}: the armored key fails its CRC-24 checksum (truncated or edited file)")
    return data


def dearmor(text: bytes, where: str = "key") -> bytes:
    """Every public-key block of an armored file, concatenated as a binary keyring."""
    lines = text.replace(b"\r\n", b"\n").split(b"\n")
    out = b""
    block: list[bytes] | None = None
    for line in lines:
        stripped = line.strip()
        if stripped == ARMOR_BEGIN:
            block = []
        elif stripped == ARMOR_END and block is not None:
            out += _dearmor_block(block, where)
            block = None
        elif block is not None:
            block.append(line)
    if block is not None:
        raise KeyError_(f"{where}: the armored key has no {ARMOR_END.decode()} line (truncated file)")
    if not out:
        raise KeyError_(f"{where}: no public key block in the armored file")
    return out


def keyring_from(data: bytes, where: str = "key") -> tuple[bytes, str]:
    """(binary keyring, "armored"|"binary") from a key file's content, whatever its name."""
    head = data.lstrip(b"\xef\xbb\xbf \t\r\n")
    if ARMOR_BEGIN in data:
        keyring, kind = dearmor(data, where), "armored"
    elif head.startswith(b"-----BEGIN PGP"):
        label = head.split(b"\n", 1)[0].strip().decode("ascii", "replace")
        raise KeyError_(f"{where}: {label} is not a public key; give the vendor's public repository key")
    else:
        keyring, kind = data, "binary"
    tag = first_packet_tag(keyring)
    if tag != PUBLIC_KEY_TAG:
        what = "empty" if not keyring else ("text" if tag is None else f"OpenPGP packet type {tag}")
        raise KeyError_(f"{where}: not an OpenPGP public key ({what}); expected an armored "
                        f"'{ARMOR_BEGIN.decode()}' file or a binary keyring")
    return keyring, kind


def _write(dest: str, data: bytes) -> None:
    """Atomic write: a temp file in the same directory, then rename."""
    fd, tmp = tempfile.mkstemp(prefix=".apt_keyring.", dir=os.path.dirname(dest) or ".")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main() -> None:
    module = AnsibleModule(
        argument_spec={"src": {"type": "path", "required": True}, "dest": {"type": "path", "required": True}},
        supports_check_mode=True,
    )
    src, dest = module.params["src"], module.params["dest"]
    try:
        with open(src, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        module.fail_json(msg=f"cannot read the repository key {src}: {exc.strerror}")
    try:
        keyring, kind = keyring_from(data, src)
    except KeyError_ as exc:
        module.fail_json(msg=str(exc))
    try:
        with open(dest, "rb") as handle:
            current: bytes | None = handle.read()
        mode_ok = (os.stat(dest).st_mode & 0o777) == 0o644
    except OSError:
        current, mode_ok = None, False
    changed = current != keyring or not mode_ok
    if changed and not module.check_mode:
        _write(dest, keyring)
    module.exit_json(changed=changed, format=kind, dest=dest, sha256=hashlib.sha256(keyring).hexdigest())


if __name__ == "__main__":
    main()
