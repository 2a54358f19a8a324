"""Version compatibility at validate time: the NCCL/CUDA build rule and the table docs/rules.md prints."""

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


# --- OFED release <-> OS, Lustre client <-> OFED ---------------------------------------------------------------
LAB_OFED = 'ofed: {flavor: doca, version: "2.9.1"}'


def with_ofed(ofed: str, os_name: str = "debian-12", lustre: str | None = None) -> str:
    assert LAB_OFED in LAB and "os: debian-12" in LAB  # the edits below must land, or a pass proves nothing
    text = LAB.replace(LAB_OFED, ofed).replace("os: debian-12", f"os: {os_name}")
    if lustre:
        text = text.replace(ofed, f'{ofed}\n  lustre_client: "{lustre}"')
        assert f'lustre_client: "{lustre}"' in text
    return text


def test_mlnx_ofed_older_than_the_first_debian12_release_is_rejected() -> None:
    found = rules(with_ofed('ofed: {flavor: mlnx_ofed, version: "23.10-2.1.3.1"}'))
    assert found["COMPAT-OS-OFED"] == ("MLNX_OFED 23.10-2.1.3.1 does not support debian-12 (its release line "
                                       "supports it from 23.10-3.2.1.1)")


@pytest.mark.parametrize("ofed", [
    'ofed: {flavor: mlnx_ofed, version: "23.10-3.2.1.1"}',  # the release that added Debian 12.5
    'ofed: {flavor: mlnx_ofed, version: "23.10-5.1.4.0"}',  # a later one of the same line
    'ofed: {flavor: mlnx_ofed, version: "24.04-0.6.6.0"}',  # a line the table does not know: silent
    'ofed: {flavor: doca, version: "2.5.2"}',
    LAB_OFED,
])
def test_ofed_releases_that_support_debian12_or_are_unknown_pass(ofed: str) -> None:
    assert "COMPAT-OS-OFED" not in rules(with_ofed(ofed))


def test_doca_older_than_the_first_debian12_release_is_rejected_only_on_debian() -> None:
    doca = 'ofed: {flavor: doca, version: "2.5.1"}'
    assert rules(with_ofed(doca))["COMPAT-OS-OFED"] == ("DOCA 2.5.1 does not support debian-12 (its release line "
                                                       "supports it from 2.5.2)")
    assert "COMPAT-OS-OFED" not in rules(with_ofed(doca, os_name="ubuntu-22.04"))


def test_lustre_client_that_does_not_build_against_the_ofed_is_rejected() -> None:
    found = rules(with_ofed('ofed: {flavor: mlnx_ofed, version: "5.2-1.0.4.0"}', os_name="ubuntu-22.04",
                            lustre="2.12.6"))
    assert found["COMPAT-LUSTRE-OS"] == ("Lustre client 2.12.6 does not build against MLNX_OFED 5.2-1.0.4.0: the "
                                         "o2iblnd build finds no ib_fmr_pool.h there (LU-14297)")


@pytest.mark.parametrize(("ofed", "lustre"), [
    ('ofed: {flavor: mlnx_ofed, version: "5.1-2.6.2.0"}', "2.12.6"),  # another OFED release: unknown, silent
    ('ofed: {flavor: mlnx_ofed, version: "5.2-1.0.4.0"}', "2.15.5"),  # another Lustre release
    (LAB_OFED, "2.15.5"),
])
def test_lustre_client_pairs_not_known_bad_pass(ofed: str, lustre: str) -> None:
    assert "COMPAT-LUSTRE-OS" not in rules(with_ofed(ofed, os_name="ubuntu-22.04", lustre=lustre))


@pytest.mark.parametrize(("flavor", "version", "os_name", "first"), [
    ("mlnx_ofed", "23.10-0.5.5.0", "debian-12", "23.10-3.2.1.1"),
    ("mlnx_ofed", "23.10-3.2.2.0", "debian-12", None),
    ("mlnx_ofed", "23.10-2.1.3.1", "ubuntu-22.04", None),
    ("doca", "2.5.0", "debian-12", "2.5.2"),
    ("doca", "2.9.1", "debian-12", None),
    ("doca", "2.5.1", "ubuntu-24.04", None),
])
def test_ofed_os_unsupported(flavor: str, version: str, os_name: str, first: str | None) -> None:
    from provisioner.spec.compat import ofed_os_unsupported

    assert ofed_os_unsupported(flavor, version, os_name) == first


def test_table_rows_name_the_os_and_lustre_facts() -> None:
    rows = compat_table()
    assert ("DOCA-OFED", "MLNX_OFED 23.10.x on debian-12", "MLNX_OFED >= 23.10-3.2.1.1") in rows
    assert ("DOCA-OFED", "DOCA 2.5.x on debian-12", "DOCA >= 2.5.2") in rows
    assert any(r[0] == "Lustre client" and r[1] == "2.12.6" and "5.2-1.0.4" in r[2] for r in rows)
