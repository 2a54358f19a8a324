"""software.containers (#25 item 3): the pins of nvidia-container-toolkit, enroot and pyxis, their site mirrors and
the node-local scratch path; validate names a bad pin, a missing mirror, a public URL on an offline site and a spec
without Slurm at their line; the inventory carries what the containers role reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.cli import main
from provisioner.render import build_inventory
from provisioner.spec import load_cluster, load_spec
from provisioner.spec.reserved import OWNED_VARS

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "h100-ndr-8node.yaml"
SLURM = """
slurm:
  controller: sm1
  partitions: [{name: gpu, nodes: "gpu[01-08]", default: true}]
"""
CONTAINERS = """  containers:
    toolkit: "1.17.3"
    repository: {url: "http://mirror.example.internal/libnvidia-container/stable/deb/amd64", key: keys/nct.gpg,
                 suite: /, components: []}
    enroot: "3.5.0"
    enroot_mirror: http://mirror.example.internal/github/NVIDIA/enroot/v3.5.0
    pyxis: "0.20.0"
    pyxis_source: http://mirror.example.internal/github/NVIDIA/pyxis/v0.20.0.tar.gz
    scratch: /raid/enroot
    image: "nvcr.io#nvidia/pytorch:24.05-py3"
"""


def _spec(tmp_path: Path, containers: str = CONTAINERS, *, slurm: str = SLURM) -> Path:
    text = EXAMPLE.read_text().replace("os: ubuntu-22.04", "os: debian-12")
    anchor = '  dcgm: "3.3.9"'
    assert anchor in text
    text = text.replace(anchor, containers + anchor, 1)
    spec = tmp_path / "c.yaml"
    spec.write_text(text + slurm)
    (tmp_path / "keys").mkdir(exist_ok=True)
    (tmp_path / "keys" / "nct.gpg").write_bytes(b"\x99\x01")
    return spec


def _line_of(spec: Path, text: str) -> int:
    return next(i for i, line in enumerate(spec.read_text().splitlines(), 1) if text in line)


def _errors(spec: Path) -> list[tuple[int, str, str]]:
    return [(d.line, d.rule, d.message + " | " + d.hint) for d in load_spec(spec).errors]


def test_a_full_containers_section_validates_and_renders_the_roles_variables(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    assert _errors(spec) == []
    cluster, _ = load_cluster(spec)
    allv = build_inventory(cluster).groupvars["all"]
    assert allv["containers_toolkit_version"] == "1.17.3"
    assert allv["containers_enroot_version"] == "3.5.0"
    assert allv["containers_enroot_mirror"] == "http://mirror.example.internal/github/NVIDIA/enroot/v3.5.0"
    assert allv["containers_pyxis_version"] == "0.20.0"
    assert allv["containers_pyxis_source"].endswith("/v0.20.0.tar.gz")
    assert allv["containers_scratch"] == "/raid/enroot"
    assert allv["vendor_repos_containers"] == {
        "url": "http://mirror.example.internal/libnvidia-container/stable/deb/amd64", "key": str(tmp_path / "keys"
                                                                                                  / "nct.gpg"),
        "suite": "/", "components": []}
    assert {k for k in allv if k.startswith("containers_")} | {"vendor_repos_containers"} <= OWNED_VARS


def test_without_containers_the_inventory_has_none_of_its_variables(tmp_path: Path) -> None:
    cluster, _ = load_cluster(_spec(tmp_path, ""))
    allv = build_inventory(cluster).groupvars["all"]
    assert [k for k in allv if "containers" in k] == []


@pytest.mark.parametrize(("bad", "good", "what"), [
    ('enroot: "3.5 .0"', 'enroot: "3.5.0"', "enroot"),
    ("toolkit: 1.17", 'toolkit: "1.17.3"', "quoted string"),
    ("scratch: raid/enroot", "scratch: /raid/enroot", "scratch"),
    ('image: "-it"', 'image: "nvcr.io#nvidia/pytorch:24.05-py3"', "image"),
])
def test_a_bad_pin_or_path_is_an_error_at_its_line(tmp_path: Path, bad: str, good: str, what: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    spec = _spec(tmp_path, CONTAINERS.replace(good, bad))
    line = _line_of(spec, bad)
    errs = _errors(spec)
    assert [ln for ln, _, _ in errs] == [line] and what in errs[0][2], errs
    assert main(["validate", str(spec)]) == 1
    out = capsys.readouterr()
    assert f"c.yaml:{line}:" in out.out + out.err and "Traceback" not in out.out + out.err


def test_a_missing_mirror_is_an_error_at_the_section(tmp_path: Path) -> None:
    # a mapping's diagnostics point at its first line, as every section's do
    spec = _spec(tmp_path, CONTAINERS.replace(
        "    enroot_mirror: http://mirror.example.internal/github/NVIDIA/enroot/v3.5.0\n", ""))
    errs = _errors(spec)
    assert [(ln, "enroot_mirror" in text) for ln, _, text in errs] == [(_line_of(spec, "toolkit:"), True)], errs


def test_an_offline_site_may_not_fetch_from_github(tmp_path: Path) -> None:
    public = "https://github.com/NVIDIA/enroot/releases/download/v3.5.0"
    spec = _spec(tmp_path, CONTAINERS.replace("http://mirror.example.internal/github/NVIDIA/enroot/v3.5.0", public))
    errs = _errors(spec)
    assert [(ln, rule) for ln, rule, _ in errs] == [(_line_of(spec, public), "CONTAINERS")], errs
    assert "enroot_mirror is the public github.com" in errs[0][2] and "site mirror" in errs[0][2]


def test_containers_without_slurm_are_refused(tmp_path: Path) -> None:
    spec = _spec(tmp_path, slurm="")
    errs = _errors(spec)
    assert [(ln, rule) for ln, rule, _ in errs] == [(_line_of(spec, "toolkit:"), "CONTAINERS")], errs
    assert "pyxis is a Slurm plugin" in errs[0][2]
