"""The nccl role's P_Key lookup: NCCL_IB_PKEY is an index in the port's table (NCCL net_ib.cc), found on the node."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("nccl_pkey", ROOT / "roles" / "nccl" / "filter_plugins" / "nccl_pkey.py")
assert _spec and _spec.loader
nccl_pkey = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nccl_pkey)


def table(dev: str, *keys: str) -> dict[str, Any]:
    """What ``grep -r . /sys/class/infiniband/<dev>/ports/1/pkeys`` prints (grep's order is the directory's)."""
    lines = [f"/sys/class/infiniband/{dev}/ports/1/pkeys/{i}:{k}" for i, k in enumerate(keys)]
    return {"item": {"device": dev, "port": 1}, "stdout_lines": list(reversed(lines))}


def test_pkey_index_is_found_per_port_and_must_agree() -> None:
    both = [table("mlx5_0", "0xffff", "0x8001", "0x0000"), table("mlx5_1", "0xffff", "0x8001")]
    assert nccl_pkey.nccl_pkey_index(both, "0x8001") == {"index": 1, "missing": [],
                                                          "indexes": {"mlx5_0:1": 1, "mlx5_1:1": 1}}
    assert nccl_pkey.nccl_pkey_index(both, "0x0001")["index"] == 1  # the key is matched on its low 15 bits
    limited = [table("mlx5_0", "0xffff", "0x0001")]  # a limited member cannot be NCCL's partition
    assert nccl_pkey.nccl_pkey_index(limited, "0x8001") == {"index": None, "missing": ["mlx5_0:1"], "indexes": {}}
    split = [table("mlx5_0", "0xffff", "0x8001"), table("mlx5_1", "0xffff", "0x8002", "0x8001")]
    found = nccl_pkey.nccl_pkey_index(split, "0x8001")
    assert found["index"] is None and found["indexes"] == {"mlx5_0:1": 1, "mlx5_1:1": 2}
    assert nccl_pkey.nccl_pkey_index([table("mlx5_0", "0xffff")], "0x8001")["missing"] == ["mlx5_0:1"]


def test_source_build_is_the_pinned_tag_with_mpi_against_the_pinned_nccl() -> None:
    """The build path the lab cannot run (no compiler on its nodes): its make line, rendered from the defaults."""
    import jinja2
    import yaml

    role = ROOT / "roles" / "nccl"
    facts = {"nccl_version": "2.21.5", "cuda_version": "12.4.1", "ansible_facts": {"processor_vcpus": 8}}
    values: dict[str, Any] = {**yaml.safe_load((role / "defaults" / "main.yml").read_text()),
                              **yaml.safe_load((role / "vars" / "main.yml").read_text()), **facts}
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)

    def render(value: Any) -> Any:
        for _ in range(5):  # defaults refer to each other
            if not isinstance(value, str) or "{{" not in value:
                return value
            value = env.from_string(value).render(**{k: v for k, v in values.items() if k != "nccl_ib_pkey_ports"})
        return value

    for key in ("nccl_cuda_version", "nccl_cuda_short", "nccl_tests_source_dir", "nccl_tests_source_url"):
        values[key] = render(values[key])
    tasks = yaml.safe_load((role / "tasks" / "build_tests.yml").read_text())
    make = next(t for t in tasks if t["name"] == "Compile nccl-tests")["ansible.builtin.command"]
    argv = [str(render(a)) for a in make["argv"]]
    assert argv[0] == "make" and "MPI=1" in argv and "NCCL_HOME=/usr" in argv
    assert "MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi" in argv and "CUDA_HOME=/usr/local/cuda" in argv
    assert values["nccl_tests_source_url"].endswith("/v2.13.10.tar.gz")
    assert values["nccl_tests_source_dir"].strip() == "/usr/local/src/nccl-tests-2.13.10-nccl2.21.5-cuda12.4-mpi"
    assert render(make["creates"]).startswith(values["nccl_tests_source_dir"])
    assert values["nccl_tests_build_from_source"] is True and values["nccl_mpi_packages"] == ["openmpi-bin"]
    # the headers (and Debian's gfortran under libopenmpi-dev) only for a source build with MPI=1, no recommends
    assert values["nccl_mpi_dev_packages"] == ["libopenmpi-dev"]
    install = yaml.safe_load((role / "tasks" / "install.yml").read_text())
    dev = next(t for t in install if "ansible.builtin.apt" in t and t["ansible.builtin.apt"]["name"]
               == "{{ nccl_mpi_dev_packages }}")
    assert dev["ansible.builtin.apt"]["install_recommends"] is False
    assert {"nccl_tests_build_from_source", "nccl_tests_build_mpi"} <= set(dev["when"])
