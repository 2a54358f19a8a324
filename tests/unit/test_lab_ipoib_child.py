"""The lab's stand-in for ib_ipoib's create_child (provisioner/lab/nodetools/ipoib_child_sim.py), run on the host
against a scratch networkd directory and a fake ``ip`` that records what it is asked and keeps a link table."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from provisioner.lab import image
from provisioner.lab.nodetools import ipoib_child_sim as sim
from tests.unit.test_ipoib_roles import CHILD, PARENT, _render

FAKE_IP = """#!/bin/sh
# fake ip: `ip -o link show` prints the links in $LINKS (one name a line); add/del edit it; every call is logged
echo "$*" >> "$IP_LOG"
case "$1 $2" in
  "-o link") n=1; while read -r l; do echo "$n: $l: <BROADCAST,UP> mtu 1500"; n=$((n+1)); done < "$LINKS" ;;
  "link add") [ -n "$IP_FAIL" ] && { echo "$IP_FAIL" >&2; exit 2; }; echo "$6" >> "$LINKS" ;;
  "link del") grep -vx "$4" "$LINKS" > "$LINKS.new"; mv "$LINKS.new" "$LINKS" ;;
esac
"""


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir, net = tmp_path / "bin", tmp_path / "network"
    bin_dir.mkdir()
    net.mkdir()
    ip = bin_dir / "ip"
    ip.write_text(FAKE_IP)
    ip.chmod(ip.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "links").write_text("lo\neth0@if12\nibp23s0@if7\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("LINKS", str(tmp_path / "links"))
    monkeypatch.setenv("IP_LOG", str(tmp_path / "ip.log"))
    monkeypatch.setenv("PLAB_IPOIB_NETWORK_DIRS", f"{net}:{tmp_path / 'absent'}")
    monkeypatch.setenv("PLAB_IPOIB_STATE", str(tmp_path / "state"))
    return tmp_path


def _calls(node: Path) -> list[str]:
    log = node / "ip.log"
    return [ln for ln in log.read_text().splitlines() if not ln.startswith("-o ")] if log.exists() else []


def test_the_child_the_role_configures_is_made_at_once_with_its_p_key(node: Path) -> None:
    # what the ipoib role writes on a simulated node: the child's .network (no .netdev), the parent's without IPoIB=
    (node / "network/50-ipoib-ibp23s0.network").write_text(_render("ipoib.network.j2", simulated=True, item=PARENT))
    (node / "network/50-ipoib-ibp23s0.8001.network").write_text(_render("ipoib.network.j2", simulated=True,
                                                                        item=CHILD))
    assert sim.main() == 0
    assert _calls(node) == ["link add link ibp23s0 name ibp23s0.8001 type macvlan mode bridge"]
    assert (node / "state/ibp23s0.8001.pkey").read_text() == "0x8001\n"
    assert sim.main() == 0 and len(_calls(node)) == 1  # the link exists: nothing more to do
    # the spec drops the node from the partition: the role removes the .network, the child goes (delete_child)
    (node / "network/50-ipoib-ibp23s0.8001.network").unlink()
    assert sim.main() == 0
    assert _calls(node)[1:] == ["link del dev ibp23s0.8001"]
    assert not (node / "state/ibp23s0.8001.pkey").exists() and "ibp23s0.8001" not in (node / "links").read_text()


def test_links_it_did_not_make_and_children_without_a_parent_are_left_alone(node: Path) -> None:
    (node / "links").write_text("lo\nibp23s0\nibp23s0.8001\n")  # attached by the lab at start (molecule's ipoib)
    (node / "network/a.network").write_text("[Match]\nName=ibp23s0.8001\n")
    (node / "network/b.network").write_text("[Match]\nName=ibp99s0.8002 eth0\n")  # no such parent
    assert sim.main() == 0 and _calls(node) == []
    (node / "network/a.network").unlink()
    assert sim.main() == 0 and _calls(node) == []  # not ours: never deleted


def test_a_refused_child_is_said_and_not_recorded(node: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (node / "network/a.network").write_text("[Match]\nName=ibp23s0.8001\n")
    monkeypatch.setenv("IP_FAIL", "Error: Unknown device type.")
    assert sim.main() == 1
    err = capsys.readouterr().err
    assert "could not create P_Key child ibp23s0.8001 of ibp23s0: Error: Unknown device type." in err
    assert not (node / "state/ibp23s0.8001.pkey").exists()


@pytest.mark.parametrize(("text", "want"), [
    ("[Match]\nName=ibp23s0.8001\n", {"ibp23s0.8001": ("ibp23s0", "0x8001")}),
    ("[Match]\nName=ibp23s0.8001\nName=\nName=ibp41s0.0002\n", {"ibp41s0.0002": ("ibp41s0", "0x0002")}),  # reset
    ("[Link]\nName=ibp23s0.8001\n", {}),                        # another section's Name=
    ("[Match]\n# Name=ibp23s0.8001\n", {}),                      # a comment
    ("[Match]\nName=ibp23s0.80011\nName=ib0.80g1 a;b.8001 $(x).8001\n", {}),  # no "<parent>.%04x", or not a name
])
def test_only_a_parent_dot_four_hex_digits_name_asks_for_a_child(text: str, want: dict[str, tuple[str, str]]) -> None:
    assert sim.wanted_children([text]) == want


def test_the_image_runs_it_at_boot_and_on_every_configuration_change() -> None:
    files = image.lab_files()
    assert files[image.IPOIB_CHILD_TOOL][1] == 0o755
    path_unit = files["/etc/systemd/system/plab-ipoib-children.path"][0].decode()
    assert "PathChanged=/etc/systemd/network\n" in path_unit and "PathChanged=/run/systemd/network\n" in path_unit
    service = files["/etc/systemd/system/plab-ipoib-children.service"][0].decode()
    assert f"ExecStart={image.IPOIB_CHILD_TOOL}\n" in service
    assert set(image.LAB_LINKS.values()) <= set(files)  # every enabling link points at a unit of the layer
    base = image.base_recipe_hash()
    assert image.image_recipe_hash(base, files) != image.image_recipe_hash(base, {
        k: v for k, v in files.items() if k != image.IPOIB_CHILD_TOOL})
