"""requirements/lock.txt is the one dependency tree development and CI install (scripts/bootstrap.sh, with hash
checking): every package pinned to one version with its hashes, and every requirement of pyproject.toml and
requirements/dev.in satisfied by it. When an input moves without `scripts/lock`, these tests say which package and
how to refresh; and they check that the environment running them was installed from the lock.
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from packaging.markers import Marker, default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements" / "lock.txt"
DEV_IN = ROOT / "requirements" / "dev.in"
PYPROJECT = ROOT / "pyproject.toml"
REFRESH = "run scripts/lock and commit requirements/lock.txt"


@dataclass
class Pin:
    name: str
    version: str
    marker: Marker | None
    hashes: list[str] = field(default_factory=list)


def parse_lock(text: str) -> tuple[dict[str, list[Pin]], list[str]]:
    """The pins of a hash-pinned requirements file (uv/pip-compile format), and what is wrong with its lines."""
    pins: dict[str, list[Pin]] = {}
    problems: list[str] = []
    current: Pin | None = None
    for n, raw in enumerate(text.replace("\\\n", " ").splitlines(), 1):
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        head, *options = re.split(r"\s+(?=--)", line)
        req = Requirement(head)
        spec = list(req.specifier)
        if len(spec) != 1 or spec[0].operator != "==":
            problems.append(f"lock line {n}: {head!r} is not pinned to one version (==)")
            continue
        current = Pin(canonicalize_name(req.name), spec[0].version, req.marker,
                      [o.split("=", 1)[1] for o in options if o.startswith("--hash=")])
        if not current.hashes:
            problems.append(f"lock line {n}: {current.name}=={current.version} has no --hash")
        pins.setdefault(current.name, []).append(current)
    return pins, problems


def applies(marker: Marker | None, env: dict[str, str]) -> bool:
    return marker is None or marker.evaluate(env)


def unmet(requirements: list[str], source: str, pins: dict[str, list[Pin]], env: dict[str, str]) -> list[str]:
    """Each requirement (for this Python/platform) that no pin of the lock satisfies, said with what to do."""
    out = []
    for text in requirements:
        req = Requirement(text)
        if not applies(req.marker, env):
            continue
        name = canonicalize_name(req.name)
        have = [p for p in pins.get(name, []) if applies(p.marker, env)]
        if not have:
            out.append(f"{source}: {text!r} is not in requirements/lock.txt ({REFRESH})")
        elif not any(req.specifier.contains(Version(p.version), prereleases=True) for p in have):
            out.append(f"{source}: {text!r} but the lock pins {name}=={have[0].version} ({REFRESH})")
    return out


def dev_requirements(text: str) -> list[str]:
    return [line.split("#", 1)[0].strip() for line in text.splitlines() if line.split("#", 1)[0].strip()]


def project_requirements(text: str) -> list[str]:
    return list(tomllib.loads(text)["project"]["dependencies"])


def disagreements(pyproject: str, dev_in: str, lock: str, env: dict[str, str]) -> list[str]:
    pins, problems = parse_lock(lock)
    return (problems + unmet(project_requirements(pyproject), "pyproject.toml", pins, env)
            + unmet(dev_requirements(dev_in), "requirements/dev.in", pins, env))


ENV = {**default_environment(), "python_version": "3.11", "python_full_version": "3.11.2"}
"""Debian 12's Python: the oldest the package supports (requires-python >= 3.11)."""


def test_the_lock_pins_every_package_with_hashes_and_satisfies_its_inputs() -> None:
    found = disagreements(PYPROJECT.read_text(), DEV_IN.read_text(), LOCK.read_text(), ENV)
    assert found == []
    pins, _ = parse_lock(LOCK.read_text())
    # the tools and the package's own dependencies are really there (the parser read the lock, not nothing)
    assert {"ansible-core", "cryptography", "paramiko", "pytest", "ruff", "uv"} <= set(pins)


def test_a_dependency_the_lock_does_not_pin_is_named() -> None:
    """What happens when someone adds a dependency (or tightens one) without refreshing the lock."""
    pyproject = PYPROJECT.read_text()
    added = pyproject.replace('dependencies = [\n', 'dependencies = [\n  "humanize>=4",\n', 1)
    assert added != pyproject
    assert disagreements(added, DEV_IN.read_text(), LOCK.read_text(), ENV) == [
        f"pyproject.toml: 'humanize>=4' is not in requirements/lock.txt ({REFRESH})"]
    raised = re.sub(r'"paramiko>=[^"]*"', '"paramiko>=99"', pyproject)
    pinned = parse_lock(LOCK.read_text())[0]["paramiko"][0].version
    assert disagreements(raised, DEV_IN.read_text(), LOCK.read_text(), ENV) == [
        f"pyproject.toml: 'paramiko>=99' but the lock pins paramiko=={pinned} ({REFRESH})"]
    moved = DEV_IN.read_text().replace("ruff==", "ruff==0.0.1\n# was ruff==")
    ruff = parse_lock(LOCK.read_text())[0]["ruff"][0].version
    assert [d for d in disagreements(PYPROJECT.read_text(), moved, LOCK.read_text(), ENV) if "ruff" in d] == [
        f"requirements/dev.in: 'ruff==0.0.1' but the lock pins ruff=={ruff} ({REFRESH})"]


def test_unpinned_or_unhashed_lock_lines_are_named() -> None:
    _, problems = parse_lock("pyyaml>=6 \\\n    --hash=sha256:00\nrich==15.0.0\n")
    assert problems == ["lock line 1: 'pyyaml>=6' is not pinned to one version (==)",
                        "lock line 2: rich==15.0.0 has no --hash"]


def test_this_environment_was_installed_from_the_lock() -> None:
    """CI and developers run from the lock: each locked package for this platform is installed at its pin."""
    pins, _ = parse_lock(LOCK.read_text())
    env = default_environment()
    wrong = []
    for name, versions in pins.items():
        want = [p.version for p in versions if applies(p.marker, env)]
        if not want:
            continue
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            have = "not installed"
        if have not in want:
            wrong.append(f"{name}: {have}, the lock pins {want[0]}")
    assert wrong == [], "run scripts/bootstrap.sh (it installs requirements/lock.txt)"
