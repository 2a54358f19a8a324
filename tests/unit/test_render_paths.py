"""Issue #26, "the spec's path becomes code": the spec file's name and directory are data in every rendered file
and every ssh argument, whatever characters they hold (a newline, YAML, a quote, a Jinja template, a shell
substitution, an ssh option)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from provisioner.export.slurm import export_gres, export_topology
from provisioner.fabric.nhc import export_nhc
from provisioner.render import render_files
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
