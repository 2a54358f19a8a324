"""The containers role (unit level; molecule/containers runs it in the lab): the pins of the toolkit and enroot,
enroot's paths on scratch, pyxis rebuilt when the Slurm headers change, its plugstack line, and which nodes the
slurm play gives it."""

from __future__ import annotations

from pathlib import Path

import jinja2
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "containers"


def _yaml(rel: str) -> object:
    return yaml.safe_load((ROLE / rel).read_text())


def _tasks(name: str) -> dict[str, dict]:
    tasks = _yaml(f"tasks/{name}.yml")
    assert isinstance(tasks, list)
    return {t["name"]: t for t in tasks}


def test_every_default_is_a_documented_argument() -> None:
    specs = _yaml("meta/argument_specs.yml")["argument_specs"]["main"]["options"]  # type: ignore[index]
    assert set(specs) == set(_yaml("defaults/main.yml"))  # type: ignore[arg-type]


def test_the_four_toolkit_packages_are_pinned_at_the_release_and_held_with_enroot() -> None:
    env = jinja2.Environment()
    env.filters["regex_replace"] = lambda s, pat, rep: __import__("re").sub(pat, rep, s, count=1)
    runtime = _tasks("runtime")
    task = runtime["Install nvidia-container-toolkit at the pinned release (nvidia-container-cli, what enroot's "
                   "hook runs)"]
    install = task["ansible.builtin.apt"]
    pin = env.from_string(task["vars"]["containers_toolkit_pin"]).render(containers_toolkit_version="1.17.3")
    names = env.from_string(install["name"]).render(
        containers_toolkit_packages=_yaml("defaults/main.yml")["containers_toolkit_packages"],  # type: ignore[index]
        containers_toolkit_pin=pin)
    assert names == str(["nvidia-container-toolkit=1.17.3-1", "nvidia-container-toolkit-base=1.17.3-1",
                         "libnvidia-container-tools=1.17.3-1", "libnvidia-container1=1.17.3-1"])
    fetch = runtime["Fetch enroot's release .debs from the site mirror"]["ansible.builtin.get_url"]
    assert fetch["url"].startswith("{{ containers_enroot_mirror }}/") and fetch["url"].endswith("-1_amd64.deb")
    hold = runtime["Hold the toolkit and enroot at the pins"]
    assert hold["loop"] == "{{ containers_toolkit_packages + containers_enroot_packages }}"


def test_enroot_keeps_cache_and_data_on_scratch_and_runtime_state_on_tmpfs() -> None:
    text = jinja2.Template((ROLE / "templates" / "enroot.conf.j2").read_text()).render(
        containers_scratch="/raid/enroot", containers_runtime_path="/run/enroot/user-$(id -u)")
    settings = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert settings == ["ENROOT_RUNTIME_PATH /run/enroot/user-$(id -u)",
                        "ENROOT_CACHE_PATH /raid/enroot/cache/group-$(id -g)",
                        "ENROOT_DATA_PATH /raid/enroot/data/user-$(id -u)", "ENROOT_TEMP_PATH /raid/enroot/tmp"]


def test_pyxis_is_rebuilt_when_pyxis_or_the_slurm_headers_change() -> None:
    stamp = _yaml("vars/main.yml")["containers_pyxis_stamp"]  # type: ignore[index]

    def render(pyxis: str, header: str) -> str:
        return jinja2.Template(stamp).render(containers_pyxis_version=pyxis,
                                             containers_slurm_headers={"stdout": header})
    base = render("0.20.0", '#define SLURM_VERSION_STRING "22.05.8"')
    assert base != render("0.20.0", '#define SLURM_VERSION_STRING "23.11.4"')
    assert base != render("0.21.0", '#define SLURM_VERSION_STRING "22.05.8"')
    source = _tasks("pyxis_source")
    build = source["Build and install pyxis when it is missing or was built from another pyxis or Slurm"]
    assert "!= containers_pyxis_stamp" in build["when"]
    pyxis = _tasks("pyxis")
    assert pyxis["Build pyxis from source against this node's Slurm"]["when"] == (
        "containers_pyxis_build_from_source | bool")
    package = pyxis["Install the site-built pyxis package at the pin"]
    assert package["ansible.builtin.apt"]["name"] == "{{ containers_pyxis_package }}={{ containers_pyxis_version }}-1"
    line = pyxis["Load pyxis in every srun, slurmd and slurmstepd (pyxis's README, plugstack.conf.d/pyxis.conf)"]
    assert line["ansible.builtin.copy"]["content"] == "required {{ containers_pyxis_plugin }}\n"
    assert line["notify"] == "Restart slurmd for pyxis"


def test_the_slurm_play_gives_it_to_slurm_hosts_where_the_spec_enables_containers() -> None:
    play = yaml.safe_load((ROOT / "playbooks" / "slurm.yml").read_text())[0]
    names = [r["role"] if isinstance(r, dict) else r for r in play["roles"]]
    assert names.index("containers") > names.index("slurm")
    (entry,) = [r for r in play["roles"] if isinstance(r, dict) and r.get("role") == "containers"]
    assert "containers_toolkit_version | default('', true) | length > 0" in entry["when"]
    assert entry["vars"]["containers_runtime"] == "{{ inventory_hostname in groups.get('gpu_nodes', []) }}"
