"""apply() against the SSH switch emulator: netmiko really logs in on 127.0.0.1 and pushes the plan.

Each test starts its own emulator on an ephemeral port and writes the emulator's host key into a known_hosts file
(keys are never learned). The spec's addresses stay as written; `endpoints` points apply() at the emulator.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from provisioner.errors import UsageError
from provisioner.spec.cluster import Cluster
from provisioner.spec.load import load_cluster
from provisioner.switches.session import SwitchResult, Timeouts, apply
from tests.switchemu import EmuSwitch, SwitchEmulator

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PASSWORD = "Sw1tch-P4ss-q7Zr"
FAST = Timeouts(connect=5, auth=5, banner=5, read=10, apply=20)


def _cluster(tmp_path: Path, example: str, *replacements: tuple[str, str], password: str = PASSWORD) -> Cluster:
    text = (EXAMPLES / example).read_text()
    for old, new in replacements:
        assert old in text
        text = text.replace(old, new)
    tmp_path.mkdir(parents=True, exist_ok=True)
    spec = tmp_path / "cluster.yaml"
    spec.write_text(text)
    secrets = tmp_path / "secrets"
    secrets.mkdir(exist_ok=True)
    creds = secrets / "switches.yml"
    creds.write_text(f"username: admin\npassword: '{password}'\n")
    creds.chmod(0o600)
    cluster, _ = load_cluster(spec)
    return cluster


def _opensm_cluster(tmp_path: Path, password: str = PASSWORD) -> Cluster:
    return _cluster(tmp_path, "a100-hdr-4node.yaml", ("embedded_sm: true", "embedded_sm: false"),
                    ("subnet_manager: {kind: switch, switch: ib-sw1}",
                     "subnet_manager: {kind: opensm, build: upstream, nodes: [{node: dgx1, priority: 15}, "
                     "{node: dgx2, priority: 14}]}"), password=password)


def _roce_cluster(tmp_path: Path) -> Cluster:
    return _cluster(tmp_path, "roce-200g-4node.yaml",
                    ("credentials: {vault: secrets/switches.vault.yml,\n"
                     "                                             vault_password_file: secrets/.vault-pass}",
                     "credentials: {file: secrets/switches.yml}"))


@pytest.fixture
def emulator(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[SwitchEmulator, Path]]:
    sw: EmuSwitch = request.param
    sw.password = PASSWORD
    with SwitchEmulator(sw) as emu:
        kh = tmp_path / "known_hosts"
        kh.write_text(emu.known_hosts_line())
        yield emu, kh


def _run(cluster: Cluster, emu: SwitchEmulator, kh: Path, name: str,
         timeouts: Timeouts = FAST) -> SwitchResult:
    (res,) = apply(cluster, kh, only={name}, endpoints={name: ("127.0.0.1", emu.port)}, timeouts=timeouts)
    return res


@pytest.mark.parametrize("emulator", [EmuSwitch("mlnxos", "ib-sw1", sm_enabled=True)], indirect=True)
def test_mlnxos_disables_embedded_sm_when_hosts_run_opensm(emulator: tuple[SwitchEmulator, Path],
                                                           tmp_path: Path) -> None:
    emu, kh = emulator
    res = _run(_opensm_cluster(tmp_path), emu, kh, "ib-sw1")
    assert res.error is None and res.ok, res.summary()
    assert emu.sw.sm_enabled is False
    assert emu.sw.saved == 1
    assert "no ib sm" in emu.sw.history and "show ib sm" in emu.sw.history
    assert [(c.field, c.got, c.ok) for c in res.checks] == [("sm", "disabled", True)]
    assert "IB1/1" in res.outputs["show interfaces ib status"]


@pytest.mark.parametrize("emulator", [EmuSwitch("mlnxos", "ib-sw1", sm_enabled=False, login_delay=1.5)],
                         indirect=True)
def test_mlnxos_enables_switch_sm_with_priority_despite_slow_login(emulator: tuple[SwitchEmulator, Path],
                                                                   tmp_path: Path) -> None:
    emu, kh = emulator
    res = _run(_cluster(tmp_path, "a100-hdr-4node.yaml"), emu, kh, "ib-sw1")
    assert res.ok, res.summary()
    assert emu.sw.sm_enabled is True and emu.sw.sm_priority == 15


@pytest.mark.parametrize("emulator", [EmuSwitch("mlnxos", "ib-sw1", sm_enabled=True, ignore={"no ib sm"})],
                         indirect=True)
def test_mlnxos_read_back_disagreement_fails_the_switch(emulator: tuple[SwitchEmulator, Path],
                                                        tmp_path: Path) -> None:
    emu, kh = emulator
    res = _run(_opensm_cluster(tmp_path), emu, kh, "ib-sw1")
    assert res.ok is False and res.error is None
    assert res.checks[0].got == "enabled"
    assert res.summary() == "ib-sw1: read-back disagrees: `show ib sm` sm is 'enabled', want 'disabled'"


@pytest.mark.parametrize("emulator", [EmuSwitch("nvue", "tor1")], indirect=True)
def test_nvue_roce_applied_and_read_back(emulator: tuple[SwitchEmulator, Path], tmp_path: Path) -> None:
    emu, kh = emulator
    res = _run(_roce_cluster(tmp_path), emu, kh, "tor1")
    assert res.ok, res.summary()
    a = emu.sw.applied
    assert a["qos roce mode"] == "lossless"
    assert a["qos pfc default-global switch-priority"] == "3"
    assert a["qos congestion-control default-global traffic-class 3 ecn"] == "enable"
    assert a["interface swp1-64 link mtu"] == "9000"
    assert emu.sw.staged == {}
    assert {c.field: c.got for c in res.checks} == {"mode": "lossless", "pfc-priority": "3",
                                                    "trust-mode": "dscp", "congestion-mode": "ECN"}


@pytest.mark.parametrize("emulator", [EmuSwitch("nvue", "tor1", fail={"nv set qos roce mode lossless"})],
                         indirect=True)
def test_nvue_command_error_is_one_line_naming_the_switch(emulator: tuple[SwitchEmulator, Path],
                                                          tmp_path: Path) -> None:
    emu, kh = emulator
    res = _run(_roce_cluster(tmp_path), emu, kh, "tor1")
    assert res.ok is False
    assert res.error is not None and "\n" not in res.error
    assert res.error.startswith("tor1: switch refused `nv set qos roce mode lossless`: Error:")
    assert "nv config apply -y" not in emu.sw.history  # nothing is applied after a refusal


@pytest.mark.parametrize("emulator", [EmuSwitch("mlnxos", "ib-sw1")], indirect=True)
def test_wrong_password(emulator: tuple[SwitchEmulator, Path], tmp_path: Path) -> None:
    emu, kh = emulator
    res = _run(_opensm_cluster(tmp_path, password="not-the-right-one"), emu, kh, "ib-sw1")
    assert res.error is not None and "\n" not in res.error
    assert res.error.startswith("ib-sw1 (10.1.255.1): authentication failed")
    assert "secrets/switches.yml" in res.error
    assert emu.sw.failed_logins >= 1 and emu.sw.logins == 0


@pytest.mark.parametrize("emulator", [EmuSwitch("mlnxos", "ib-sw1", auth_delay=3.0)], indirect=True)
def test_authentication_slower_than_the_timeout(emulator: tuple[SwitchEmulator, Path], tmp_path: Path) -> None:
    emu, kh = emulator
    slow = Timeouts(connect=5, auth=1, banner=5, read=5, apply=5)
    res = _run(_opensm_cluster(tmp_path), emu, kh, "ib-sw1", timeouts=slow)
    assert res.ok is False and res.error is not None
    assert res.error.startswith("ib-sw1 (10.1.255.1):") and "timed out" in res.error
    assert "\n" not in res.error


@pytest.mark.parametrize("emulator", [EmuSwitch("mlnxos", "ib-sw1")], indirect=True)
def test_unknown_host_key_is_refused_before_login(emulator: tuple[SwitchEmulator, Path], tmp_path: Path) -> None:
    emu, kh = emulator
    other = paramiko.ECDSAKey.generate()
    kh.write_text(f"[127.0.0.1]:{emu.port + 1} {other.get_name()} {other.get_base64()}\n")
    res = _run(_opensm_cluster(tmp_path), emu, kh, "ib-sw1")
    assert res.error is not None and "host key unknown" in res.error
    assert emu.sw.logins == 0 and emu.sw.failed_logins == 0  # the password was never offered
    assert emu.sw.history == []


def test_missing_known_hosts_and_unknown_switch_names(tmp_path: Path) -> None:
    cluster = _opensm_cluster(tmp_path)
    with pytest.raises(UsageError, match="known_hosts"):
        apply(cluster, tmp_path / "absent")
    kh = tmp_path / "kh"
    kh.write_text("")
    with pytest.raises(UsageError, match="not managed switches: nope"):
        apply(cluster, kh, only={"nope"})


@pytest.mark.parametrize("emulator", [EmuSwitch("mlnxos", "ib-sw1", sm_enabled=True)], indirect=True)
def test_password_appears_nowhere(emulator: tuple[SwitchEmulator, Path], tmp_path: Path,
                                  caplog: pytest.LogCaptureFixture) -> None:
    """Success, wrong password and refused host key: logs, results, messages and files never hold the secret."""
    emu, kh = emulator
    caplog.set_level(logging.DEBUG)
    good = _opensm_cluster(tmp_path / "good")
    wrong_pw = "Wr0ng-" + PASSWORD
    bad = _opensm_cluster(tmp_path / "bad", password=wrong_pw)
    results = [_run(good, emu, kh, "ib-sw1"), _run(bad, emu, kh, "ib-sw1")]
    strange = tmp_path / "strange_kh"
    strange.write_text(f"[127.0.0.1]:1 {emu.key.get_name()} {emu.key.get_base64()}\n")
    results.append(_run(good, emu, strange, "ib-sw1"))
    errors: list[str] = []
    try:
        apply(good, tmp_path / "absent")
    except UsageError as exc:
        errors.append(str(exc) + repr(exc))
    assert results[0].ok and results[1].error and results[2].error
    texts = [caplog.text, *errors, *(repr(r) + r.summary() + str(r.outputs) for r in results)]
    for path in tmp_path.rglob("*"):
        if path.is_file() and path.parent.name != "secrets":
            texts.append(path.read_text(errors="replace"))
    for secret in (PASSWORD, wrong_pw):
        assert not [t for t in texts if secret in t]
    assert caplog.text  # something was logged, so the check above had something to look at
