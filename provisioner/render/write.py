"""Render the inventory files into a state directory, deterministically, with a diff against the last render."""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import yaml

from provisioner.gcpause import without_gc
from provisioner.render.model import Inventory, build_inventory
from provisioner.spec.cluster import Cluster
from provisioner.state import fsync_dir, state_dir_for, write_text_atomic

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("provisioner.render", "templates"),
    undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True,
    autoescape=False,  # noqa: S701 - renders YAML, not HTML; names are pattern-checked by the spec
)


class _Unsafe(str):
    """A string value of the inventory: written with Ansible's `!unsafe` tag, so Ansible never templates it.

    Every string in the inventory comes from the spec or an overlay (or is the tool's own constant): site data
    must never become code, and a `{{ lookup('pipe', ...) }}` in it would otherwise run on the control node."""

    __slots__ = ()


# libyaml's emitter when present (a 4,096-node render is dominated by YAML emission), else PyYAML's own;
# both give the same text for the plain data rendered here.
class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    pass


_Dumper.add_representer(_Unsafe, lambda dumper, value: dumper.represent_scalar("!unsafe", str(value)))


_PLAIN_IPV4 = re.compile(r"[0-9]{1,3}(\.[0-9]{1,3}){3}")
"""A dotted quad, which YAML writes plain after its tag (no resolver reads it as a number), as the golden files show."""


_STR_TAG = "tag:yaml.org,2002:str"
_RESOLVER = yaml.resolver.Resolver()


def _reads_as_text(value: str) -> bool:
    """Whether ``value`` written plain would load as a string.

    Ansible (ansible-core 2.19, ``_constructor.construct_yaml_unsafe``) resolves an ``!unsafe`` scalar again as if
    it were plain, ignoring its quotes: ``!unsafe '550'`` loads as the integer 550, ``!unsafe '0x8001'`` as 32769,
    ``!unsafe 'on'`` as True. Such a string has no character Jinja could start a template with, so it is written
    quoted without the tag and stays a string; every other string gets ``!unsafe``."""
    tag: str = _RESOLVER.resolve(yaml.ScalarNode, value, (True, False))  # type: ignore[no-untyped-call]
    return tag == _STR_TAG


def _plain(data: Any) -> Any:
    """Copies without shared sub-objects (so no emitter writes anchors and aliases), text marked unsafe."""
    if isinstance(data, dict):
        return {k: _plain(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_plain(v) for v in data]
    if isinstance(data, str):
        return _Unsafe(data) if _reads_as_text(data) else data
    return data


_WIDTH = 1 << 20
"""Never fold a long string: where a fold falls depends on the length of the paths inside it (the spec's
directory), so the same spec rendered from another checkout would differ, and grep would miss split values."""


def _dump(header: str, data: dict[str, Any]) -> str:
    body = yaml.dump(_plain(data), Dumper=_Dumper, sort_keys=True, default_flow_style=False, allow_unicode=True,
                     width=_WIDTH)
    return f"---\n# {header}\n{body}"


@without_gc
def render_files(cluster: Cluster, inv: Inventory | None = None) -> dict[str, str]:
    """Every file of the rendered inventory, keyed by path relative to the output directory."""
    inv = inv or build_inventory(cluster)
    spec_name = cluster.source  # shown, control characters escaped: a newline would end the comment
    files: dict[str, str] = {}
    files["hosts.yml"] = _ENV.get_template("hosts.yml.j2").render(
        spec_file=spec_name, hosts=[n.name for n in cluster.nodes], groups=inv.groups)
    header = f"Rendered by provisioner from {spec_name} — do not edit"
    for group, gv in sorted(inv.groupvars.items()):
        files[f"group_vars/{group}.yml"] = _dump(header, gv)
    # Nodes of one profile mostly share their host vars but for the address: each distinct rest is dumped once.
    # Top-level keys of a block mapping are independent lines, so the address line plus the rest is byte for byte
    # what dumping the whole mapping gives (ansible_host sorts first; the golden files prove it).
    rests: dict[str, str] = {}
    for host, hv in sorted(inv.hostvars.items()):
        rest = {k: v for k, v in hv.items() if k != "ansible_host"}
        if "ansible_host" not in hv or not rest or min(hv) != "ansible_host":
            files[f"host_vars/{host}.yml"] = _dump(header, hv)
            continue
        key = json.dumps(rest, sort_keys=True, default=str)
        if key not in rests:
            rests[key] = _dump(header, rest)
        address = (f"ansible_host: !unsafe {hv['ansible_host']}\n" if _PLAIN_IPV4.fullmatch(str(hv["ansible_host"]))
                   else yaml.dump(_plain({"ansible_host": hv["ansible_host"]}), Dumper=_Dumper,
                                  default_flow_style=False, allow_unicode=True, width=_WIDTH))
        head, _, body = rests[key].partition(f"# {header}\n")
        files[f"host_vars/{host}.yml"] = f"{head}# {header}\n{address}{body}"
    return files


@dataclass
class RenderResult:
    out_dir: Path
    written: list[str]
    removed: list[str]
    diff: str


def default_state_dir(cluster: Cluster) -> Path:
    return state_dir_for(cluster.name)


def render_inventory(cluster: Cluster, out_dir: Path | None = None) -> RenderResult:
    """Write the inventory under `out_dir/inventory` (default .provision/<cluster>/inventory)."""
    base = (out_dir or default_state_dir(cluster)) / "inventory"
    files = render_files(cluster)
    old: dict[str, str] = {}
    if base.is_dir():
        for p in sorted(base.rglob("*.yml")):
            old[str(p.relative_to(base))] = p.read_text(encoding="utf-8")
    diff_parts: list[str] = []
    for rel in sorted(set(old) | set(files)):
        a, b = old.get(rel, ""), files.get(rel, "")
        if a != b:
            diff_parts.extend(difflib.unified_diff(
                a.splitlines(keepends=True), b.splitlines(keepends=True),
                fromfile=f"a/{rel}" if rel in old else "/dev/null", tofile=f"b/{rel}" if rel in files else "/dev/null"))
    written: list[str] = []
    for rel, content in files.items():
        if old.get(rel) == content:
            continue
        write_text_atomic(base / rel, content, mode=0o644)
        written.append(rel)
    removed = [rel for rel in old if rel not in files]
    for rel in removed:
        (base / rel).unlink()
    for parent in {(base / rel).parent for rel in removed}:
        fsync_dir(parent)
    return RenderResult(base, written, removed, "".join(diff_parts))
