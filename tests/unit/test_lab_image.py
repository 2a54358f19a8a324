"""image: which apt entry serves Debian itself, and recipe hashes that change only with the recipe."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.errors import LabError
from provisioner.lab import image

DEBIAN_SOURCES = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
"""

NODESOURCE = """\
Types: deb
URIs: https://deb.nodesource.com/node_20.x
Suites: nodistro
Components: main
"""


def _etc(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / "sources.list.d").mkdir()
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def test_picks_debian_entry_not_thirdparty_or_security(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(image.MIRROR_ENV, raising=False)
    etc = _etc(tmp_path, {"sources.list.d/a-nodesource.sources": NODESOURCE,
                          "sources.list.d/debian.sources": DEBIAN_SOURCES})
    assert image.host_mirror(etc) == "http://deb.debian.org/debian"


def test_one_line_sources_with_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(image.MIRROR_ENV, raising=False)
    text = (
        "deb https://security.debian.org/debian-security bookworm-security main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian/ bookworm main\n"
    )
    etc = _etc(tmp_path, {"sources.list": text})
    assert image.host_mirror(etc) == "http://mirror.example/debian/"


def test_env_override_and_missing_mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    etc = _etc(tmp_path, {"sources.list.d/n.sources": NODESOURCE})
    monkeypatch.delenv(image.MIRROR_ENV, raising=False)
    with pytest.raises(LabError, match="no Debian mirror"):
        image.host_mirror(etc)
    monkeypatch.setenv(image.MIRROR_ENV, "http://local/debian")
    assert image.host_mirror(etc) == "http://local/debian"


def test_disabled_deb822_entry_is_skipped() -> None:
    entries = image.parse_deb822("Enabled: no\n" + DEBIAN_SOURCES.split("\n\n")[0])
    assert image.pick_mirror(entries) is None


def test_recipe_hashes() -> None:
    base = image.base_recipe_hash()
    assert base == image.base_recipe_hash()
    assert base != image.base_recipe_hash(packages=(*image.IMAGE_PACKAGES, "vim"))
    files = image.lab_files()
    assert set(files) >= {"/usr/local/sbin/modprobe", "/usr/local/sbin/lsmod", "/usr/lib/provisioner-lab/labstate.py"}
    full = image.image_recipe_hash(base, files)
    changed = dict(files, **{"/usr/local/sbin/lsmod": (b"#!/bin/sh\n", 0o755)})
    assert full != image.image_recipe_hash(base, changed)
    assert full == image.image_recipe_hash(base, dict(files))


def _imports(source: bytes) -> set[str]:
    """Top-level module names a Python file imports (any depth of the AST)."""
    import ast

    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_every_simulated_tool_finds_its_modules_in_the_image() -> None:
    """Installed scripts import flat modules from /usr/lib/provisioner-lab: the lab layer must hold all of them."""
    import sys

    from provisioner.lab.packages import VendorVersions, recipes_for

    layer = image.lab_files()
    provided = {Path(p).stem for p in layer if p.startswith(image.LAB_LIB_DIR + "/") and p.endswith(".py")}
    assert {"labstate", "fabsim_common", "fabsim_perftest", "fabsim_nccl", "fabsim_sm"} <= provided
    scripts = {path: content for path, (content, mode) in layer.items() if mode & 0o111}
    for recipe in recipes_for(VendorVersions()):
        scripts.update({f.path: f.content for f in recipe.files if f.content.startswith(b"#!/usr/bin/python3")})
    assert {"/usr/sbin/opensm", "/usr/bin/ib_write_bw", "/usr/local/bin/all_reduce_perf", "/usr/bin/nvidia-smi",
            "/usr/local/sbin/sminfo", "/usr/local/sbin/iblinkinfo"} <= set(scripts)
    pending = list(scripts.items())
    seen: set[str] = set()
    while pending:
        path, source = pending.pop()
        for name in _imports(source) - set(sys.stdlib_module_names) - {"provisioner", "__future__"}:
            assert name in provided, f"{path} imports {name}, which the image lacks"
            if name not in seen:
                seen.add(name)
                pending.append((name, layer[f"{image.LAB_LIB_DIR}/{name}.py"][0]))
    assert "fabsim_common" in seen and "labstate" in seen
