"""The wheel is the product: built from the checkout, installed into a fresh virtualenv and run from another
directory, `provision` finds its playbooks and roles inside the installed package, never in the checkout.

Offline and about half a minute: the wheel is built with hatchling (pinned in requirements/lock.txt) without build
isolation; the fresh virtualenv gets its dependencies as hard links of this environment's installed packages (the
locked set, without the checkout's editable provisioner) and then only the wheel (pip --no-deps --no-index), so
nothing of the checkout is on its sys.path or PATH; ansible-core's commands are written for it from ansible-core's
own entry points, as pip would. The run goes to 127.0.0.x port 1 (refused at once): loopback only.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PHASE_ROLES = ("preflight", "vendor_repos", "doca_ofed", "nvidia_driver", "opensm", "nfs_server", "slurm")

NEEDS_BUILD = pytest.mark.skipif(importlib.util.find_spec("hatchling") is None,
                                 reason="no build backend: hatchling is not installed (requirements/lock.txt pins it)")


def test_collections_the_roles_use_come_with_the_package() -> None:
    """Every collection a role or playbook names (ansible.posix.mount, ...) is shipped by a declared dependency: a
    pipx install has nothing else (the lab demo from a pipx install stopped at gpu_stack on 'couldn't resolve
    module/action ansible.posix.authorized_key' while only ansible-core was a dependency)."""
    used: set[str] = set()
    for path in [*(ROOT / "roles").rglob("*.yml"), *(ROOT / "playbooks").rglob("*.yml")]:
        for m in re.finditer(r"^[ -]*([a-z0-9_]+)\.([a-z0-9_]+)\.[a-z0-9_]+:", path.read_text(), re.M):
            used.add(f"{m[1]}.{m[2]}")
    used -= {"ansible.builtin", "provisioner.cluster"}
    assert {"ansible.posix", "community.general"} <= used  # the scan sees them
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "ansible" in {re.split(r"[<>=!~ \[;]", d, maxsplit=1)[0].lower() for d in deps}
    shipped = {str(f) for f in importlib.metadata.distribution("ansible").files or []}
    for coll in sorted(used):
        ns, name = coll.split(".")
        assert f"ansible_collections/{ns}/{name}/MANIFEST.json" in shipped, f"{coll} is not in the ansible package"
    # and the collection says so itself, for ansible-galaxy and AWX
    galaxy = yaml.safe_load((ROOT / "provisioner/ansible_collections/provisioner/cluster/galaxy.yml").read_text())
    assert set(galaxy["dependencies"]) == used


def test_every_role_needs_the_ansible_the_collection_needs() -> None:
    """meta/runtime.yml requires ansible-core >= 2.19 (the roles use its templating); no role may claim less."""
    runtime = yaml.safe_load((ROOT / "provisioner/ansible_collections/provisioner/cluster/meta/runtime.yml")
                             .read_text())
    floor = re.match(r">=([0-9.]+?)(\.0)?,", runtime["requires_ansible"])
    assert floor is not None
    claimed = {p.parent.parent.name: str(yaml.safe_load(p.read_text())["galaxy_info"]["min_ansible_version"])
               for p in (ROOT / "roles").glob("*/meta/main.yml")}
    assert len(claimed) >= 16 and set(claimed.values()) == {floor.group(1)}, claimed


def under_root(path: str) -> bool:
    return Path(path).resolve().is_relative_to(ROOT) if path else False


def outside_env() -> dict[str, str]:
    """The caller's environment without anything of the checkout: no venv activation, no PATH entry inside it."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "ANSIBLE_CONFIG")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and not under_root(p))
    return env


def sh(cmd: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem
        shutil.copy2(src, dst)


def copy_packages(src: Path, dst: Path) -> None:
    """Every installed distribution of ``src`` but the editable provisioner, hard-linked into ``dst``."""
    editable = {"_provisioner.pth"} | {p.name for p in src.glob("provisioner-*.dist-info")}
    for entry in src.iterdir():
        if entry.name in editable or entry.name == "__pycache__":
            continue
        if entry.is_dir():
            shutil.copytree(entry, dst / entry.name, copy_function=_link_or_copy, symlinks=True)
        else:
            _link_or_copy(str(entry), str(dst / entry.name))


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the wheel built from this checkout installed; returns its directory."""
    base = tmp_path_factory.mktemp("pkg")
    dist = base / "dist"
    build = sh([sys.executable, "-c", "import sys; from hatchling.build import build_wheel; "
                "print(build_wheel(sys.argv[1]))", str(dist)], cwd=ROOT)
    assert build.returncode == 0, build.stderr
    wheel = dist / build.stdout.strip().splitlines()[-1]
    names = zipfile.ZipFile(wheel).namelist()
    coll = "provisioner/ansible_collections/provisioner/cluster/"
    for member in ("galaxy.yml", "meta/runtime.yml", "plugins/inventory/spec.py", "playbooks/site.yml",
                   "roles/opensm/tasks/main.yml", "roles/vendor_repos/library/apt_keyring.py"):
        assert coll + member in names, member
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]

    venv = base / "venv"
    made = sh([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=base)
    assert made.returncode == 0, made.stderr
    purelib = Path(sh([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                      cwd=base).stdout.strip())
    # the dependencies (ansible-core, pydantic, ...) as this environment installed them from the lock, linked into
    # the new one: its sys.path then names only itself. The checkout's editable provisioner is left behind (its
    # .pth line names the checkout): `provisioner` comes from the wheel
    copy_packages(Path(sysconfig.get_paths()["purelib"]), purelib)
    pip = sh([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--no-deps",
              "--no-index", "--disable-pip-version-check", "-q", str(wheel)], cwd=base)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    for ep in importlib.metadata.distribution("ansible-core").entry_points:
        if ep.group == "console_scripts":
            module, func = ep.value.split(":")
            script = venv / "bin" / ep.name
            script.write_text(f"#!{venv}/bin/python\nimport sys\nfrom {module} import {func}\nsys.exit({func}())\n")
            script.chmod(0o755)
    return venv


@pytest.mark.slow
@NEEDS_BUILD
def test_installed_wheel_runs_from_another_directory(installed: Path, tmp_path: Path) -> None:
    python, provision = installed / "bin" / "python", installed / "bin" / "provision"
    env = outside_env()
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = sh([str(python), "-c", "import provisioner.collection as c; print(c.collection().root)"], cwd=work, env=env)
    coll = Path(where.stdout.strip())
    assert coll.is_relative_to(installed) and not coll.is_relative_to(ROOT), where.stdout + where.stderr
    pkg_root = sh([str(provision), "collection-path"], cwd=work, env=env).stdout.strip()
    assert Path(pkg_root) == coll.parents[2]
    # exported as the docs say (for the inventory plugin): the runs must not pick it up (runner.collections_path_env)
    env["ANSIBLE_COLLECTIONS_PATH"] = pkg_root

    (work / "cluster.yaml").write_text((ROOT / "examples" / "lab" / "cluster.yaml").read_text())
    (work / "known_hosts").write_text("")
    addresses = {"gpu01": "127.0.0.11", "gpu02": "127.0.0.12", "gpu03": "127.0.0.13", "sm1": "127.0.0.21",
                 "sm2": "127.0.0.22"}
    (work / "overlay.yaml").write_text("ssh: {port: 1, known_hosts: known_hosts}\naddresses: "
                                       + json.dumps(addresses) + "\n")
    valid = sh([str(provision), "validate", "cluster.yaml"], cwd=work, env=env)
    assert valid.returncode == 0 and "0 error(s)" in valid.stdout + valid.stderr, valid.stdout + valid.stderr

    up = sh([str(provision), "up", "cluster.yaml", "--overlay", "overlay.yaml", "--check", "--out", "state",
             "--max-fail", "100"], cwd=work, env=env)
    text = up.stdout + up.stderr
    # preflight reached every node (refused on port 1): the playbook and the role's tasks were found and ran
    assert up.returncode == 1 and "preflight: partial (0 ok, 0 failed, 5 unreachable)" in text, text
    assert "not built" not in text and "not_built" not in text
    [run_dir] = (work / "state" / "runs").iterdir()
    artifacts = run_dir / "preflight" / "artifacts" / "preflight"
    events = [json.loads(p.read_text()) for p in (artifacts / "job_events").glob("*.json")]
    task_paths = {str(e["event_data"]["task_path"]) for e in events if e.get("event_data", {}).get("task_path")}
    assert all(p.startswith(str(coll) + "/") for p in task_paths), task_paths
    assert any(p.startswith(str(coll / "roles" / "preflight" / "tasks")) for p in task_paths), task_paths
    # what the run used, not what any library printed: the interpreter, its sys.path, PATH and ansible's paths
    path = sh([str(python), "-c", "import json, sys; print(json.dumps(sys.path))"], cwd=work, env=env)
    assert [p for p in json.loads(path.stdout) if under_root(p)] == [], path.stdout
    command = json.loads((artifacts / "command").read_text())
    ran_with = command["env"]
    assert [p for p in ran_with["PATH"].split(os.pathsep) if under_root(p)] == [], ran_with["PATH"]
    playbook_cmd = shutil.which(command["command"][0], path=ran_with["PATH"])
    assert playbook_cmd and Path(playbook_cmd).is_relative_to(installed), (command["command"][0], playbook_cmd)
    assert ran_with["ANSIBLE_ROLES_PATH"] == str(coll / "roles")
    assert pkg_root not in ran_with["ANSIBLE_COLLECTIONS_PATH"]

    # every phase's playbook and role (with the modules roles carry) resolves from the package, under the
    # settings the run used: ansible-playbook --list-tasks of site.yml, which imports every phase
    listing = sh([str(installed / "bin" / "ansible-playbook"), "--list-tasks", "-i", str(run_dir / "inventory"),
                  str(coll / "playbooks" / "site.yml")], cwd=work,
                 env={**env, **{k: v for k, v in ran_with.items() if k.startswith("ANSIBLE_")}})
    assert listing.returncode == 0, listing.stdout + listing.stderr
    for role in PHASE_ROLES:
        assert f"{role} : " in listing.stdout, role


@pytest.mark.slow
@NEEDS_BUILD
def test_installed_inventory_plugin_from_another_directory(installed: Path, tmp_path: Path) -> None:
    """AWX's way: a config file naming provisioner.cluster.spec, the collection found through collections_path."""
    env = outside_env()
    env["ANSIBLE_COLLECTIONS_PATH"] = sh([str(installed / "bin" / "provision"), "collection-path"], cwd=tmp_path,
                                         env=env).stdout.strip()
    (tmp_path / "cluster.yaml").write_text((ROOT / "examples" / "lab" / "cluster.yaml").read_text())
    (tmp_path / "lab.provisioner.yml").write_text("plugin: provisioner.cluster.spec\nspec: cluster.yaml\n")
    inv = sh([str(installed / "bin" / "ansible-inventory"), "-i", "lab.provisioner.yml", "--list"], cwd=tmp_path,
             env=env)
    assert inv.returncode == 0, inv.stderr
    data = json.loads(inv.stdout)
    assert sorted(data["_meta"]["hostvars"]) == ["gpu01", "gpu02", "gpu03", "sm1", "sm2"]
    assert data["_meta"]["hostvars"]["gpu01"]["ansible_host"] == {"__ansible_unsafe": "10.213.38.11"}
