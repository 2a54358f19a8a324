"""Issue #26, "the spec's path becomes code": the spec file's name and directory are data in every rendered file
and every ssh argument, whatever characters they hold (a newline, YAML, a quote, a Jinja template, a shell
substitution, an ssh option)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.plugins.connection import ConnectionBase

from provisioner.cli import main
from provisioner.export.slurm import export_gres, export_topology
from provisioner.fabric.nhc import export_nhc
from provisioner.render import build_inventory, render_files
from provisioner.spec import load_cluster
from provisioner.spec.cluster import Cluster

ROOT = Path(__file__).resolve().parents[2]
H100 = ROOT / "examples" / "h100-ndr-8node.yaml"
LOOKUP = "{{ lookup('pipe', 'touch ran') }}"


class TagLoader(yaml.SafeLoader):
    """Reads a rendered file, keeping the `!unsafe` tag visible in the data."""


TagLoader.add_constructor("!unsafe", lambda loader, node: ("!unsafe", loader.construct_scalar(node)))


def spec_at(path: Path) -> Cluster:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(H100.read_text())
    cluster, _ = load_cluster(path)
    return cluster


def write_files(files: dict[str, str], out: Path) -> None:
    for rel, text in files.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text, encoding="utf-8")


def parsed(files: dict[str, str], spec_dir: Path) -> dict[str, Any]:
    return {rel: yaml.load(text.replace(str(spec_dir), "__SPEC_DIR__"), Loader=TagLoader)
            for rel, text in files.items()}


def header_line(text: str) -> str:
    return next(ln for ln in text.splitlines() if ln.startswith("# Rendered by provisioner from "))


def ansible_debug(inventory: Path, var: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """What ansible makes of a variable of the rendered inventory (debug runs on the control node)."""
    exe = Path(sys.executable).parent / "ansible"
    return subprocess.run([str(exe), "gpu01", "-i", str(inventory / "hosts.yml"), "-m", "ansible.builtin.debug",
                           "-a", f"var={var}"], capture_output=True, text=True, timeout=120, check=False, cwd=cwd,
                          env={**os.environ, "ANSIBLE_HOST_KEY_CHECKING": "True", "ANSIBLE_FORCE_COLOR": "0"})


# --- the spec file's name in the header comments -------------------------------------------------------------
HOSTILE_NAME = f"cluster.yaml\nansible_connection: local\nprovisioner_note: \"{LOOKUP}\"\n# x"


def test_a_spec_name_with_a_newline_and_yaml_stays_inside_the_comment(tmp_path: Path) -> None:
    """Was: the newline ended the header comment, and the next lines became variables of group_vars/all.yml (and
    of every host), ansible_connection: local and a template that ran `touch` on the control node."""
    plain = spec_at(tmp_path / "plain" / "cluster.yaml")
    hostile = spec_at(tmp_path / "hostile" / HOSTILE_NAME)
    got = render_files(hostile)
    # the same data as the plainly named spec, file by file: no key, host or group came from the name
    assert parsed(got, tmp_path / "hostile") == parsed(render_files(plain), tmp_path / "plain")
    escaped = HOSTILE_NAME.replace("\n", "\\n")
    for rel, text in got.items():
        assert f"from {escaped} — do not edit" in header_line(text), rel
    assert "ansible_connection" not in "".join(got.values()).replace(escaped, "")
    out = tmp_path / "inventory"
    write_files(got, out)
    done = ansible_debug(out, "provisioner_note", tmp_path)
    assert not (tmp_path / "ran").exists(), "a template from the spec's name ran a command on the control node"
    assert done.returncode == 0, done.stdout + done.stderr
    assert "'provisioner_note' is undefined" in done.stdout, done.stdout


def test_a_spec_name_with_a_newline_stays_inside_the_exports_comments(tmp_path: Path) -> None:
    """nhc.conf, topology.conf and gres.conf name the spec in their first comment line: a newline there would
    start a configuration line of NHC or Slurm."""
    plain = spec_at(tmp_path / "plain" / "cluster.yaml")
    hostile = spec_at(tmp_path / "hostile" / "cluster.yaml\nSwitchName=evil Nodes=gpu01\n#")
    for export in (export_nhc, export_topology, export_gres):
        text, want = export(hostile), export(plain)
        assert text.count("\n") == want.count("\n"), export.__name__
        assert "SwitchName=evil" not in "\n".join(ln for ln in text.splitlines() if not ln.startswith("#"))
        assert "from cluster.yaml\\nSwitchName=evil Nodes=gpu01\\n#;" in text.splitlines()[0], export.__name__


def test_a_plain_spec_name_with_spaces_and_unicode_is_shown_as_is(tmp_path: Path) -> None:
    cluster = spec_at(tmp_path / "my cluster — été.yaml")
    for rel, text in render_files(cluster).items():
        assert header_line(text).startswith("# Rendered by provisioner from my cluster — été.yaml — do not"), rel


# --- the spec's directory in the ssh arguments ---------------------------------------------------------------
def common_args(cluster: Cluster, spec_dir: Path) -> str:
    """ansible_ssh_common_args as ansible reads it back from the rendered group_vars/all.yml."""
    allv = yaml.load(render_files(cluster)["group_vars/all.yml"], Loader=TagLoader)
    tag, value = allv["ansible_ssh_common_args"]
    assert tag == "!unsafe"
    return str(value)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def openssh(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """ssh as ansible starts it, to a loopback port nothing listens on: it fails, unless a ProxyCommand runs."""
    argv = ["ssh", "-F", "/dev/null", *args, "-o", "BatchMode=yes", "-o", "ControlMaster=no", "-o",
            "ConnectTimeout=5", "-p", str(closed_port()), "127.0.0.1", "true"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, cwd=cwd)


def ssh_config(args: list[str]) -> dict[str, str]:
    """What ssh makes of the options (`ssh -G`: the configuration it would use; it connects nowhere)."""
    done = subprocess.run(["ssh", "-G", "-F", "/dev/null", *args, "node"], capture_output=True, text=True,
                          timeout=60, check=True)
    return dict(ln.partition(" ")[::2] for ln in done.stdout.splitlines())


needs_ssh = pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client (ssh)")


@needs_ssh
def test_a_spec_dir_with_a_quote_and_an_ssh_option_stays_one_path(tmp_path: Path) -> None:
    """Was: `-o UserKnownHostsFile=<dir>/known_hosts` unquoted, so ansible's shlex split made the rest of the
    directory's name ssh options of their own, and ssh ran the ProxyCommand (touch) on the control node."""
    spec_dir = tmp_path / "x '-oProxyCommand=touch ran' -oSendEnv=y"
    argv = ConnectionBase._split_ssh_args(common_args(spec_at(spec_dir / "cluster.yaml"), spec_dir))
    kh = spec_dir / "known_hosts"
    assert argv == ["-o", "StrictHostKeyChecking=yes", "-o", f'UserKnownHostsFile="{kh}"', "-o",
                    "ControlMaster=auto", "-o", "ControlPersist=60s"]
    seen = ssh_config(argv)
    assert seen["userknownhostsfile"] == str(kh) and "proxycommand" not in seen and "sendenv" not in seen
    done = openssh(argv, tmp_path)
    assert not (tmp_path / "ran").exists(), "a ProxyCommand from the spec's directory ran on the control node"
    assert done.returncode == 255 and "Connection refused" in done.stderr, done.stderr


@needs_ssh
def test_a_spec_dir_with_spaces_and_a_substitution_stays_one_path(tmp_path: Path) -> None:
    spec_dir = tmp_path / "my site" / "$(touch ran) `touch ran` ; #x"
    argv = ConnectionBase._split_ssh_args(common_args(spec_at(spec_dir / "cluster.yaml"), spec_dir))
    assert argv[3] == f'UserKnownHostsFile="{spec_dir / "known_hosts"}"'
    assert ssh_config(argv)["userknownhostsfile"] == str(spec_dir / "known_hosts")
    openssh(argv, tmp_path)
    assert not (tmp_path / "ran").exists()


def test_a_template_in_the_spec_dir_stays_text_for_ansible(tmp_path: Path) -> None:
    """Every path from the spec's directory is written `!unsafe` (write._plain): ansible shows the template and
    runs nothing (a guard: this held before issue #26 too)."""
    spec_dir = tmp_path / LOOKUP
    cluster = spec_at(spec_dir / "cluster.yaml")
    out = tmp_path / "inventory"
    write_files(render_files(cluster), out)
    for var in ("provisioner_known_hosts", "ansible_ssh_common_args", "vendor_repos_cuda"):
        done = ansible_debug(out, var, tmp_path)
        assert done.returncode == 0 and "{{ lookup(" in done.stdout, done.stdout + done.stderr
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize(("name", "char"), [("100%", "%"), ("${HOME}", "$"), ('say "hi"', '"'), ("a\\b", "\\"),
                                            ("two\nlines", "\n")])
def test_what_ssh_would_rewrite_in_a_path_is_refused(tmp_path: Path, name: str, char: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """ssh expands %-tokens and ${VAR} in UserKnownHostsFile and IdentityFile, and reads '"' and '\\' as its own
    quoting: no quoting keeps such a path intact, so `provision render` says which path and character, exit 2."""
    spec = tmp_path / name / "cluster.yaml"
    spec_at(spec)
    rc = main(["render", str(spec), "--out", str(tmp_path / "state")])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("provision: error: ssh.known_hosts: the path ") and repr(char) in lines[0], lines[0]
    assert not (tmp_path / "state" / "inventory").exists()


def test_the_key_path_is_held_to_the_same_rule(tmp_path: Path) -> None:
    """ansible writes ansible_ssh_private_key_file into `-o IdentityFile="<path>"` itself: a '"' in it ends
    ansible's quotes, a '%' is a token to ssh."""
    from provisioner.errors import UsageError
    from provisioner.render.ssh import ssh_path

    assert ssh_path("/srv/my site/$(x)/id", "ssh.key") == "/srv/my site/$(x)/id"
    with pytest.raises(UsageError, match=r"ssh.key: the path '/srv/a\"b/id' has '\"'"):
        ssh_path('/srv/a"b/id', "ssh.key")
    cluster = spec_at(tmp_path / "100%" / "cluster.yaml")
    cluster.spec.ssh.known_hosts, cluster.spec.ssh.key = "/srv/kh", "keys/id"
    with pytest.raises(UsageError, match=r"ssh.key: the path .*100%.* has '%'"):
        build_inventory(cluster)


def test_the_inventory_plugin_refuses_the_path_at_its_source(tmp_path: Path) -> None:
    """Through `ansible-inventory` (AWX) the same refusal, prefixed with the inventory source: no hosts, no
    traceback, no inventory with a path ssh would read otherwise."""
    spec_dir = tmp_path / "100%"
    spec_at(spec_dir / "cluster.yaml")
    config = spec_dir / "cluster.provisioner.yml"
    config.write_text("plugin: provisioner.cluster.spec\nspec: cluster.yaml\n")
    exe = Path(sys.executable).parent / "ansible-inventory"
    done = subprocess.run([str(exe), "-i", str(config), "--list"], capture_output=True, text=True, timeout=120,
                          check=False, cwd=ROOT)
    assert f"{config}: ssh.known_hosts: the path '{spec_dir / 'known_hosts'}' has '%'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert json.loads(done.stdout)["_meta"]["hostvars"] == {}


# --- the state directory (--out) in the per-run ansible.cfg and ssh's ControlPath --------------------------------
def ansible_reads(cfg_text: str, where: Path) -> dict[str, str]:
    """The settings as ansible-core reads the per-run ansible.cfg back (`ansible-config dump`)."""
    cfg = where / "ansible.cfg"
    cfg.write_text(cfg_text)
    exe = Path(sys.executable).parent / "ansible-config"
    done = subprocess.run([str(exe), "dump", "-t", "all"], capture_output=True, text=True, timeout=120, check=True,
                          env={**os.environ, "ANSIBLE_CONFIG": str(cfg)}, cwd=where)
    return {k.strip(): v.strip() for k, _, v in (ln.partition("=") for ln in done.stdout.splitlines()) if v}


def test_a_state_dir_with_spaces_reaches_ansible_as_given(tmp_path: Path) -> None:
    from provisioner.runner import ansible_settings, render_ansible_cfg

    state = tmp_path / "my state" / "it's $(x)"
    seen = ansible_reads(render_ansible_cfg(ansible_settings(state, forks=3)), tmp_path)
    assert seen[f"CACHE_PLUGIN_CONNECTION({tmp_path / 'ansible.cfg'})"] == str(state / "facts")


@pytest.mark.parametrize(("name", "char"), [("a ;b", ";"), ("100%", "%"), ('say "hi"', '"'), ("two\nlines", "\n")])
def test_a_state_dir_ansible_or_ssh_would_read_otherwise_is_refused(tmp_path: Path, name: str, char: str) -> None:
    """Was: ansible.cfg took ' ;' as the start of a comment (the fact cache went to the directory above), and ssh
    read ansible's ControlPath="<state>/cp/<hash>" with its own tokens and quotes (every connection failed)."""
    from provisioner.errors import UsageError
    from provisioner.runner import ansible_settings, render_ansible_cfg

    with pytest.raises(UsageError, match=r"the state directory .* has " + re.escape(repr(char))):
        render_ansible_cfg(ansible_settings(tmp_path / name, forks=3))
    # a run is refused before it makes anything there
    from provisioner.runner import run_playbook

    (tmp_path / "site.yml").write_text("- hosts: all\n  gather_facts: false\n  tasks: []\n")
    (tmp_path / "inventory.yml").write_text("all: {hosts: {alpha: {ansible_connection: local}}}\n")
    with pytest.raises(UsageError, match=r"the state directory .* has " + re.escape(repr(char))):
        run_playbook(tmp_path / "site.yml", tmp_path / "inventory.yml", private_data_dir=tmp_path / name)
    assert not (tmp_path / name).exists()
