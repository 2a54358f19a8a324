"""The SSH options ansible's ``ssh`` connection gets (``ansible_ssh_common_args``), rendered from the validated spec.

Every hop is held to the same host-key rule: ``StrictHostKeyChecking=yes`` against the spec's known_hosts, never
``accept-new``. With a bastion (``ssh.jump``) that takes care, because OpenSSH does not carry the command line's
options over to a jump host:

* ``ProxyJump`` makes ``ssh`` start a second ``ssh`` for the jump host with only ``-l``, ``-p``, ``-J``, ``-F`` (when
  ``-F`` was given) and ``-v`` (openssh-portable ``ssh.c``, where it builds the implicit ProxyCommand from
  ``options.jump_host``), and ssh_config(5) says under ProxyJump that "the configuration for the destination host
  (either supplied via the command-line or the configuration file) is not generally applied to jump hosts". With
  ``-o ProxyJump=`` the bastion's key would be checked against ~/.ssh/known_hosts, or accepted if the user's
  ssh_config says ``StrictHostKeyChecking accept-new``.
* So the hop is written out as a ``ProxyCommand`` that runs ``ssh -W %h:%p`` with the same strict options. ssh runs
  it with the user's shell as ``exec <command>`` after expanding ``%h``/``%p`` (ssh_config(5) ProxyCommand and
  TOKENS; ``expand_proxy_command`` in ``sshconnect.c``), and a ProxyCommand given first wins over a ProxyJump in the
  user's config ("whichever is specified first will prevent later instances of the other", ssh_config(5)).

What is put in the command: the bastion's host, user and port (pattern-checked by the spec models: no leading
``-``, no quote, space, ``%`` or shell character), and the known_hosts and key paths resolved against the spec's
directory. Those paths pass through three parsers (ansible's shlex split, the shell, ssh's own option and ``%``
token parsing), so they must be made of plain path characters; anything else is refused rather than escaped
three times over.

Without a bastion the paths are data too, whatever directory the spec is in (a space, a quote, ``$(...)``): the
known_hosts path goes into ``ansible_ssh_common_args``, which ansible splits with ``shlex.split``
(``ConnectionBase._split_ssh_args``) and hands to ssh without a shell, and ssh reads the ``-o`` value with its own
word splitting (``argv_split``: a space separates the files of ``UserKnownHostsFile``, double quotes group). So a
path that is not plain is written ``'UserKnownHostsFile="<path>"'``: shell quotes for ansible, double quotes for
ssh. What no quoting keeps intact is refused (:func:`ssh_path`): ssh expands ``%`` tokens and ``${VAR}`` in
UserKnownHostsFile and IdentityFile (ssh_config(5) TOKENS and ENVIRONMENT VARIABLES), ``"`` and ``\\`` are its
quoting (and ansible's own ``IdentityFile="<key>"``), and a control character is no part of a path anyone meant.
"""

from __future__ import annotations

import re
import shlex
from typing import NamedTuple

from provisioner.errors import UsageError

CONTROL_PERSIST_S = 60
JUMP_CONNECT_TIMEOUT_S = 10
_PLAIN_PATH = re.compile(r"^[A-Za-z0-9._/~@+-]+$")


_SSH_REWRITES = re.compile(r'[%"\\\x00-\x1f\x7f]|\$\{')
"""What ssh would not read as part of a file name however it is quoted: tokens, variables, its quoting, controls."""


def _plain(path: str, what: str) -> str:
    if not _PLAIN_PATH.match(path):
        bad = next(ch for ch in path if not _PLAIN_PATH.match(ch))
        raise UsageError(f"ssh.jump: the {what} path {path!r} has {bad!r}, which ssh's ProxyCommand would "
                         "reinterpret (space, quote, '%', shell characters)",
                         hint="keep the spec, the key and known_hosts under paths made of letters, digits and ._/~@+-")
    return path


def ssh_rewrites(path: str) -> str | None:
    """The first character of ``path`` that ssh would not keep as part of a file name, or None."""
    found = _SSH_REWRITES.search(path)
    return found.group()[0] if found else None


def ssh_path(path: str, what: str) -> str:
    """``path`` if ssh takes it as one file name once quoted (:func:`_ssh_option`); else a :class:`UsageError`
    naming the path and the character (``what``: the spec field it comes from)."""
    bad = ssh_rewrites(path)
    if bad is not None:
        raise UsageError(f"{what}: the path {path!r} has {bad!r}, which ssh reads as a token, a "
                         "variable or its own quoting, not as part of a file name",
                         hint="keep the spec and these files under a directory whose path has no %, ${, "
                              "double quote, backslash or control character")
    return path


def _ssh_option(name: str, path: str) -> str:
    """``-o`` value naming a file, written for ansible's shlex split and then ssh's own word split: as it is
    when plain (the golden files), else in ssh's double quotes inside shell quotes."""
    return f"{name}={path}" if _PLAIN_PATH.match(path) else shlex.quote(f'{name}="{path}"')


def strict_host_key_options(known_hosts: str) -> list[str]:
    """The options every hop gets: the spec's known_hosts only, and an unknown or changed key is refused."""
    return ["-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}"]


class Hop(NamedTuple):
    """The bastion as the spec gives it (``ssh.jump``, the user defaulted to ``ssh.user``)."""

    host: str
    user: str
    port: int


def proxy_command(jump: Hop, *, known_hosts: str, key: str | None) -> str:
    """The ProxyCommand that reaches a node through the bastion with the same strict host-key options.

    ``BatchMode=yes``: the hop never prompts (a password or passphrase prompt would hang the run);
    ``ConnectTimeout``: a bastion that does not answer fails like an unreachable node instead of waiting for TCP.
    """
    words = ["ssh", *strict_host_key_options(_plain(known_hosts, "known_hosts")), "-o", "BatchMode=yes",
             "-o", f"ConnectTimeout={JUMP_CONNECT_TIMEOUT_S}"]
    if key is not None:
        words += ["-i", _plain(key, "ssh.key")]
    words += ["-p", str(jump.port), "-l", jump.user, "-W", "%h:%p", jump.host]
    return shlex.join(words)


def ssh_common_args(*, known_hosts: str, key: str | None, jump: Hop | None = None) -> str:
    """``ansible_ssh_common_args`` for the spec: strict host keys, multiplexing, and the bastion hop if any
    (one shell-quoted word, as ansible splits this setting with shlex). ``key`` goes to ansible as
    ``ansible_ssh_private_key_file``, which it writes into ``-o IdentityFile="<key>"``: it is held to the same rule.
    """
    hop = [] if jump is None else ["-o", shlex.quote("ProxyCommand=" + proxy_command(jump, known_hosts=known_hosts,
                                                                                     key=key))]
    ssh_path(known_hosts, "ssh.known_hosts")
    if key is not None:
        ssh_path(key, "ssh.key")
    return " ".join(["-o", "StrictHostKeyChecking=yes", "-o", _ssh_option("UserKnownHostsFile", known_hosts),
                     "-o", "ControlMaster=auto", "-o", f"ControlPersist={CONTROL_PERSIST_S}s", *hop])
