"""Site data never becomes connection settings or code (issue #16, item 1).

site_vars and the overlay could set any ansible_* variable (host-key checking off, connection local), overlay
addresses were not validated, and a Jinja expression in them ran on the control node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.lab.cluster import LAB_SITE_VARS
from provisioner.render import render_files
from provisioner.render.model import build_inventory
from provisioner.spec import load_cluster, load_spec, load_text
from provisioner.spec.reserved import ANSIBLE_RESERVED_NAMES, OWNED_VARS, why_reserved

ROOT = Path(__file__).resolve().parents[2]
H100 = ROOT / "examples" / "h100-ndr-8node.yaml"
LAB = ROOT / "examples" / "lab" / "cluster.yaml"


def spec_with_site_vars(lines: list[str]) -> tuple[str, int]:
    text = H100.read_text() + "site_vars:\n" + "".join(f"  {ln}\n" for ln in lines)
    return text, len(H100.read_text().splitlines()) + 2  # line of the first site var


@pytest.mark.parametrize("line", [
    "ansible_ssh_args: -oStrictHostKeyChecking=no",
    "ansible_ssh_common_args: -oUserKnownHostsFile=/dev/null",
    "ansible_connection: local",
    "ansible_become_exe: /tmp/x",
    "ansible_python_interpreter: /tmp/evil",
    "provisioner_cluster: other",
    "nvidia_driver_version: 999.1.1",
    "opensm_priority: 15",
    "hostvars: 1",
    "environment: x",
    "become: true",
], ids=lambda line: line.split(":")[0])
def test_site_vars_may_not_set_owned_or_ansible_variables(line: str) -> None:
    text, at = spec_with_site_vars(["preflight_gpu_evidence: nvidia-smi", line])
    res = load_text(text, "c.yaml")
    assert res.cluster is None
    [d] = res.errors
    name = line.split(":")[0]
    assert (d.rule, d.file, d.line, d.col) == ("SPEC-RESERVED-VAR", "c.yaml", at + 1, 3), d.format()
    assert name in d.message


def test_role_tunables_stay_allowed() -> None:
    text, _ = spec_with_site_vars([f"{k}: {json.dumps(v)}" for k, v in LAB_SITE_VARS.items()]
                                  + ['doca_ofed_ofed_version: "24.04-0.6.6.0"'])
    res = load_text(text, "c.yaml")
    assert res.cluster is not None and not res.errors, [d.format() for d in res.errors]


def overlay_file(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "overlay.yaml"
    p.write_text(body)
    return p


def test_overlay_site_vars_are_checked_at_the_overlay_line(tmp_path: Path) -> None:
    ov = overlay_file(tmp_path, "ssh: {user: root}\nsite_vars:\n  nfs_client_userspace_tools: true\n"
                                "  ansible_connection: local\n")
    res = load_spec(LAB, ov)
    assert res.cluster is None
    [d] = res.errors
    assert (d.rule, d.file, d.line) == ("SPEC-RESERVED-VAR", str(ov), 4), d.format()


@pytest.mark.parametrize(("addresses", "rule", "line"), [
    ("  gpu01: \"{{ lookup('pipe', 'id') }}\"\n", "SPEC-ADDRESS", 3),
    ("  gpu01: 10.0.0.300\n", "SPEC-ADDRESS", 3),
    ("  gpu01: [10.0.0.1]\n", "SPEC-ADDRESS", 3),
    ("  gpu09: 10.213.38.99\n", "SPEC-UNDEFINED-NODE", 3),
    ("  gpu01: 10.213.38.12\n", "SPEC-DUP-ADDRESS", 3),  # gpu02's address in the spec
], ids=["jinja", "bad-octet", "list", "unknown-node", "duplicate"])
def test_overlay_addresses_are_validated(tmp_path: Path, addresses: str, rule: str, line: int) -> None:
    ov = overlay_file(tmp_path, "ssh: {user: root}\naddresses:\n" + addresses)
    res = load_spec(LAB, ov)
    assert [(d.rule, d.file, d.line) for d in res.errors] == [(rule, str(ov), line)], \
        [d.format() for d in res.errors]


def test_overlay_problems_name_the_overlay(tmp_path: Path) -> None:
    ov = overlay_file(tmp_path, "ssh:\n  port: lots\nsite_vars: {x: 1}\nbogus: 1\n")
    found = {(d.rule, d.file, d.line) for d in load_spec(LAB, ov).errors}
    assert ("SPEC-SCHEMA", str(ov), 2) in found, found
    assert ("SPEC-UNKNOWN-KEY", str(ov), 4) in found, found
    ov = overlay_file(tmp_path, "ssh: {user: root\naddresses:\n  gpu01: 10.0.0.1\n")
    [d] = load_spec(LAB, ov).errors
    assert (d.rule, d.file, d.line) == ("YAML-SYNTAX", str(ov), 1), d.format()


def test_good_overlay_still_applies(tmp_path: Path) -> None:
    ov = overlay_file(tmp_path, "addresses:\n  gpu01: 10.99.0.1\nsite_vars:\n  preflight_gpu_evidence: nvidia-smi\n")
    cluster, _ = load_cluster(LAB, ov)
    assert cluster.node("gpu01").address == "10.99.0.1"
    assert cluster.spec.site_vars == {"preflight_gpu_evidence": "nvidia-smi"}


# --- every string the inventory holds is unsafe for templating ---------------------------------------------------
class TagLoader(yaml.SafeLoader):
    """Reads the rendered files and remembers every scalar's tag."""


TagLoader.add_constructor("!unsafe", lambda loader, node: ("!unsafe", loader.construct_scalar(node)))


def _untagged_strings(data: Any, where: str) -> list[str]:
    if isinstance(data, dict):
        return [x for k, v in data.items() for x in _untagged_strings(v, f"{where}.{k}")]
    if isinstance(data, list):
        return [x for i, v in enumerate(data) for x in _untagged_strings(v, f"{where}[{i}]")]
    if isinstance(data, str) and yaml.resolver.Resolver().resolve(yaml.ScalarNode, data, (True, False)) == STR_TAG:
        return [f"{where}={data!r}"]  # text without the tag (a number-like string such as '550' needs none)
    return []


STR_TAG = "tag:yaml.org,2002:str"


def test_number_like_strings_stay_strings_for_ansible(tmp_path: Path) -> None:
    """ansible-core 2.19 resolves an !unsafe scalar as if plain (`!unsafe '550'` is the integer 550): such strings
    are written quoted without the tag, so the roles get '550' and '0x8001', not 550 and 32769 (the e2e run's
    driver-pin check failed on exactly that)."""
    cluster, _ = load_cluster(H100)
    out = tmp_path / "inventory"
    for rel, text in render_files(cluster).items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
    ansible = Path(sys.executable).parent / "ansible"
    expr = ("[nvidia_driver_branch is string, nvidia_driver_branch == nvidia_driver_version.split('.')[0], "
            "opensm_partitions[0].pkey is string, nvidia_driver_version is string]")
    done = subprocess.run([str(ansible), "sm1", "-i", str(out / "hosts.yml"), "-m", "ansible.builtin.debug",
                           "-a", f"msg={{{{ {expr} }}}}"], capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "ANSIBLE_FORCE_COLOR": "0"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("true") == 4 and "false" not in done.stdout, done.stdout


@pytest.mark.parametrize("example", sorted(p.name for p in (ROOT / "examples").glob("*.yaml")))
def test_every_rendered_string_is_unsafe(example: str) -> None:
    cluster, _ = load_cluster(ROOT / "examples" / example)
    for rel, text in render_files(cluster).items():
        if rel == "hosts.yml":
            continue  # names only (pattern-checked), no values
        data = yaml.load(text, Loader=TagLoader)
        assert _untagged_strings(data, rel) == []


def test_jinja_in_the_inventory_is_never_run(tmp_path: Path) -> None:
    """What ansible does with a template that reached the inventory: prints it, never evaluates it."""
    cluster, _ = load_cluster(H100)
    inv = build_inventory(cluster)
    marker = tmp_path / "ran"
    inv.hostvars["gpu01"]["site_note"] = "{{ lookup('pipe', 'touch " + str(marker) + "') }}{{ 6 * 7 }}"
    out = tmp_path / "inventory"
    for rel, text in render_files(cluster, inv).items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
    ansible = Path(sys.executable).parent / "ansible"
    done = subprocess.run([str(ansible), "gpu01", "-i", str(out / "hosts.yml"), "-m", "ansible.builtin.debug",
                           "-a", "var=site_note"], capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "ANSIBLE_HOST_KEY_CHECKING": "True", "ANSIBLE_FORCE_COLOR": "0"})
    assert done.returncode == 0, done.stdout + done.stderr
    shown = done.stdout.replace(str(marker), "")  # the temporary path may hold a 42 of its own
    assert "{{ 6 * 7 }}" in shown and "42" not in shown, done.stdout
    assert not marker.exists(), "a template from the inventory ran a command on the control node"


def test_inventory_plugin_values_are_not_templates(tmp_path: Path) -> None:
    """Through the inventory plugin (config file with spec: and overlay:) the overlay is validated like the spec
    (a template is refused at its file:line), and every value from spec and overlay arrives tagged unsafe."""
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "cluster.yaml").write_text(H100.read_text())
    config = tmp_path / "cluster.provisioner.yml"
    config.write_text("plugin: provisioner.cluster.spec\nspec: specs/cluster.yaml\noverlay: overlay.yaml\n")
    exe = Path(sys.executable).parent / "ansible-inventory"

    def inventory(overlay: str) -> subprocess.CompletedProcess[str]:
        overlay_file(tmp_path, overlay)
        return subprocess.run([str(exe), "-i", str(config), "--list"], capture_output=True, text=True, timeout=120,
                              check=False, cwd=ROOT)

    bad = inventory("addresses: {gpu01: 192.0.2.7}\nsite_vars: {overlay_note: '{{ 6 * 7 }}'}\n")
    assert f"{tmp_path / 'overlay.yaml'}:2:27: SPEC-SCHEMA: site_vars.overlay_note" in bad.stderr, bad.stderr
    assert json.loads(bad.stdout)["_meta"]["hostvars"] == {}
    good = inventory("addresses: {gpu01: 192.0.2.7}\nsite_vars: {overlay_note: a-b}\n")
    assert good.returncode == 0, good.stderr
    gpu01 = json.loads(good.stdout)["_meta"]["hostvars"]["gpu01"]
    assert gpu01["ansible_host"] == {"__ansible_unsafe": "192.0.2.7"}  # from the overlay, unsafe
    assert gpu01["overlay_note"] == {"__ansible_unsafe": "a-b"}


def test_owned_vars_cover_everything_the_tool_renders() -> None:
    """A new rendered variable must be added to OWNED_VARS, or site_vars could contradict the spec through it."""
    missing: set[str] = set()
    specs = [*(ROOT / "examples").glob("*.yaml"), LAB]
    for path in specs:
        cluster, _ = load_cluster(path)
        inv = build_inventory(cluster)
        for block in [*inv.groupvars.values(), *inv.hostvars.values()]:
            missing |= {k for k in block if k not in cluster.spec.site_vars and why_reserved(k) is None}
    assert missing == set(), f"add to provisioner/spec/reserved.py OWNED_VARS: {sorted(missing)}"
    assert OWNED_VARS.isdisjoint(LAB_SITE_VARS)


def test_reserved_names_follow_ansible() -> None:
    from ansible.vars.reserved import get_reserved_names

    assert set(get_reserved_names()) <= ANSIBLE_RESERVED_NAMES


# --- item 9: '..' in any path that reaches a node ----------------------------------------------------------------
@pytest.mark.parametrize(("old", "new"), [
    ("mount: /home,", "mount: /home/../etc,"),
    ("export: /export/home,", "export: /export/home/..,"),
    ("path: /export/home,", "path: /export/../etc,"),
    ("mount: /lustre/scratch,", "mount: /lustre/scratch/../../root,"),
    ("x86_64, key: keys/cuda.gpg", "x86_64/../../../etc, key: keys/cuda.gpg"),
    ("options: [rw, sync, root_squash]", "options: [rw, sync, root_squash, fsid=/../x]"),
], ids=["nfs-mount", "nfs-export", "export-path", "lustre-mount", "repo-url", "export-option"])
def test_parent_dir_never_reaches_a_node(old: str, new: str) -> None:
    text = H100.read_text()
    assert old in text
    text = text.replace(old, new, 1)
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if new in ln)
    res = load_text(text, "c.yaml")
    bad = [d for d in res.errors if "'..' is not allowed" in d.message]
    assert [d.line for d in bad] == [line], [d.format() for d in res.errors]


def test_parent_dir_in_site_vars_and_overlays(tmp_path: Path) -> None:
    text, at = spec_with_site_vars(["preflight_gpu_evidence: ../../etc/shadow", "nfs_note: a..b"])
    [d] = load_text(text, "c.yaml").errors
    assert d.line == at and "'..' is not allowed" in d.message, d.format()
    ov = overlay_file(tmp_path, "site_vars:\n  preflight_gpu_evidence: /var/../../etc\n")
    [d] = load_spec(LAB, ov).errors
    assert (d.file, d.line) == (str(ov), 2) and "'..'" in d.message, d.format()


# --- ssh.jump (#17): the bastion's host, user and port reach ssh's command line through a ProxyCommand ------------
@pytest.mark.parametrize(("jump", "field"), [
    ("{host: 'bastion;touch /tmp/x', user: ops}", "ssh.jump.host"),
    ("{host: '$(id).example.com'}", "ssh.jump.host"),
    ("{host: '-oProxyCommand=sh'}", "ssh.jump.host"),
    ("{host: 'bastion %h'}", "ssh.jump.host"),
    ("{host: \"{{ lookup('pipe', 'id') }}\"}", "ssh.jump.host"),
    ("{host: 10.0.0.300}", "ssh.jump.host"),
    ("{host: bastion, user: 'ops`id`'}", "ssh.jump.user"),
    ("{host: bastion, port: 70000}", "ssh.jump.port"),
    ("{host: bastion, options: '-oStrictHostKeyChecking=no'}", "unknown key 'options'"),
    ("ops@bastion:22", "ssh.jump"),
], ids=["semicolon", "subshell", "option", "token", "jinja", "bad-octet", "backtick", "port", "extra-key", "string"])
def test_jump_host_values_are_validated(jump: str, field: str) -> None:
    old = "ssh: {user: root, key: ~/.ssh/id_ed25519, known_hosts: known_hosts}"
    text = H100.read_text()
    assert old in text
    res = load_text(text.replace(old, f"ssh: {{user: root, jump: {jump}}}"), "c.yaml")
    assert res.cluster is None
    [d] = res.errors
    assert d.line == 4 and field in d.format(), d.format()
