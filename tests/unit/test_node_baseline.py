"""The node baseline in the spec (#25): the Secure Boot MOK DKMS signs with, and the NTP servers chrony uses."""

from __future__ import annotations

from pathlib import Path

from provisioner.cli import main
from provisioner.render import build_inventory, render_files
from provisioner.spec import load_cluster, load_spec
from provisioner.spec.reserved import why_reserved

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "h100-ndr-8node.yaml"
BASELINE = """
secure_boot:
  mok_key: keys/mok.key
  mok_cert: keys/mok.der
time:
  servers: [ntp1.example.com, 10.0.0.1]
"""
KEY_TEXT = "-----BEGIN PRIVATE KEY-----\nnot-a-real-key-but-secret\n-----END PRIVATE KEY-----\n"


def _spec(tmp_path: Path, extra: str = BASELINE, *, key: bool = True, cert: bool = True) -> Path:
    spec = tmp_path / "c.yaml"
    spec.write_text(EXAMPLE.read_text() + extra)
    (tmp_path / "keys").mkdir(exist_ok=True)
    if key:
        (tmp_path / "keys" / "mok.key").write_text(KEY_TEXT)
    if cert:
        (tmp_path / "keys" / "mok.der").write_bytes(b"0\x82\x03\x00")
    return spec


def test_the_baseline_reaches_the_roles_as_paths_and_names(tmp_path: Path) -> None:
    cluster, _ = load_cluster(_spec(tmp_path))
    allv = build_inventory(cluster).groupvars["all"]
    assert allv["preflight_mok_key"] == str(tmp_path / "keys" / "mok.key")
    assert allv["preflight_mok_cert"] == str(tmp_path / "keys" / "mok.der")
    assert allv["host_tuning_ntp_servers"] == ["ntp1.example.com", "10.0.0.1"]
    # the key travels as a path the role copies with no_log: its content is in no rendered file
    files = render_files(cluster)
    assert not any("not-a-real-key" in text for text in files.values())
    assert "preflight_mok_key: !unsafe" in files["group_vars/all.yml"]


def test_site_vars_cannot_set_the_baseline(tmp_path: Path) -> None:
    # a site_vars preflight_mok_key would copy any control-node file (an SSH key) to every node
    cluster, _ = load_cluster(_spec(tmp_path))
    allv = build_inventory(cluster).groupvars["all"]
    assert [k for k in allv if why_reserved(k) is None] == []


def test_without_the_settings_nothing_is_rendered(tmp_path: Path) -> None:
    cluster, _ = load_cluster(_spec(tmp_path, ""))
    allv = build_inventory(cluster).groupvars["all"]
    assert not {"preflight_mok_key", "preflight_mok_cert", "host_tuning_ntp_servers"} & set(allv)


def test_a_missing_key_file_is_a_validate_error_at_its_line(tmp_path: Path, capsys: object) -> None:
    spec = _spec(tmp_path, key=False)
    res = load_spec(spec)
    errs = [d for d in res.errors if d.rule == "SECURE-BOOT-FILES"]
    line = EXAMPLE.read_text().count("\n") + 3  # the mok_key line of BASELINE
    assert [(d.line, "mok_key" in d.message) for d in errs] == [(line, True)]
    assert str(tmp_path / "keys" / "mok.key") in errs[0].message
    assert main(["validate", str(spec)]) == 1
    out = capsys.readouterr()  # type: ignore[attr-defined]
    assert f"c.yaml:{line}:" in out.out + out.err and "Traceback" not in out.out + out.err


def test_a_missing_certificate_is_named_too(tmp_path: Path) -> None:
    res = load_spec(_spec(tmp_path, cert=False))
    assert [d.message.split()[0] for d in res.errors if d.rule == "SECURE-BOOT-FILES"] == ["secure_boot.mok_cert"]


def test_bad_ntp_server_names_and_an_empty_list_are_refused(tmp_path: Path) -> None:
    assert load_spec(_spec(tmp_path, "time:\n  servers: [ntp1.example.com, 10.0.0.1]\n")).errors == []
    for servers in ("['-oProxyCommand=x']", "['10.0.0.300']", "[]", "['a b']", "['ntp1\\nallow all']"):
        res = load_spec(_spec(tmp_path, f"time:\n  servers: {servers}\n"))
        assert [d.rule for d in res.errors] == ["SPEC-SCHEMA"], (servers, res.errors)
        assert res.cluster is None
