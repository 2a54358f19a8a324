"""Version compatibility at validate time: the NCCL/CUDA build rule and the table the README prints."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.spec import load_text
from provisioner.spec.compat import DOCA_OFED, compat_table, nccl_cuda_mismatch

ROOT = Path(__file__).resolve().parents[2]
LAB = (ROOT / "examples" / "lab" / "cluster.yaml").read_text()


def with_versions(cuda: str, nccl: str, driver: str = "550.90.07") -> str:
    text = LAB.replace('cuda: "12.4.1"', f'cuda: "{cuda}"').replace('nccl: "2.21.5"', f'nccl: "{nccl}"')
    return text.replace('version: "550.90.07"', f'version: "{driver}"')


def rules(text: str) -> dict[str, str]:
    return {d.rule: d.message for d in load_text(text, "cluster.yaml").diagnostics}


def test_nccl_without_a_build_for_the_cuda_major_is_rejected() -> None:
    found = rules(with_versions("12.4.1", "2.12.10"))
    assert found["COMPAT-NCCL-CUDA"] == "NCCL 2.12.10 has builds for CUDA 10.2, 11.0, 11.6 only, none for CUDA 12.4.1"


def test_nccl_with_a_build_of_the_same_major_passes() -> None:
    assert "COMPAT-NCCL-CUDA" not in rules(with_versions("12.4.1", "2.30.7", driver="570.124.06"))


@pytest.mark.parametrize(("nccl", "cuda", "bad"), [
    ("2.30.7", "13.0", False), ("2.30.7", "11.8", True), ("2.10.3", "11.8", False), ("2.21.5", "11.8", False),
])
def test_nccl_cuda_mismatch(nccl: str, cuda: str, bad: bool) -> None:
    assert (nccl_cuda_mismatch(nccl, cuda) is not None) is bad


def test_doca_map_matches_the_doca_ofed_role() -> None:
    import yaml

    defaults = yaml.safe_load((ROOT / "roles" / "doca_ofed" / "defaults" / "main.yml").read_text())
    assert defaults["doca_ofed_doca_releases"] == DOCA_OFED


def test_table_rows_name_every_fact() -> None:
    rows = compat_table()
    assert ("NCCL", "2.12.10", "built for CUDA 10.2, 11.0, 11.6 (same CUDA major)") in rows
    assert ("CUDA", "12.4.1", "driver >= 550.54.15") in rows
    assert ("driver", "B200-SXM-180GB", "branch >= 570, open kernel modules only") in rows
    assert ("DOCA-OFED", "2.9.1", "ofed_info -s = OFED-internal-24.10-1.1.4.0") in rows
