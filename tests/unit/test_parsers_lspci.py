"""lspci -vvv on real captures: device lines (-nn, -D), LnkCap/LnkSta with lspci's (ok)/(downgraded) marks, bridge
bus ranges and ACS flags, and the grep'd forms operators paste (no device line)."""

from __future__ import annotations

import pytest

from provisioner.errors import ParseError
from provisioner.parsers import parse
from provisioner.parsers.lspci import below_capable
from tests.unit._parser_fixtures import load


def _lspci(name: str) -> dict:
    return parse("lspci", load("lspci", name))


def test_nn_header_gives_class_code_ids_and_rev() -> None:
    (gpu,) = _lspci("hwloc653_a100_sxm4_nn.txt")["devices"]
    assert gpu["bdf"] == "0000:da:00.0"
    assert (gpu["class_name"], gpu["class_code"]) == ("3D controller", "0302")
    assert (gpu["vendor_id"], gpu["device_id"], gpu["rev"]) == ("10de", "20b0", "a1")
    assert gpu["name"] == "NVIDIA Corporation GA100 [A100 SXM4 40GB]"
    assert gpu["port_type"] == "endpoint"
    assert gpu["link_cap"] is None and gpu["link_sta"] is None  # the excerpt stops before them


def test_speed_downgraded_on_a_riser_is_read_with_its_capability() -> None:
    out = _lspci("jan183_rtx4090_riser_grep.txt")
    (dev,) = out["devices"]
    assert dev["bdf"] is None
    assert dev["link_cap"] == {"speed_gts": 16, "width": 16}
    assert dev["link_sta"] == {"speed_gts": 2.5, "width": 16, "speed_downgraded": True, "width_downgraded": False}
    assert below_capable(dev)
    assert any("without their" in w for w in out["warnings"])


def test_width_and_speed_downgraded() -> None:
    (dev,) = _lspci("sbc50_lichee_width_downgraded.txt")["devices"]
    assert dev["link_cap"] == {"speed_gts": 8, "width": 4}
    assert dev["link_sta"]["width"] == 2 and dev["link_sta"]["width_downgraded"]
    (quadro,) = _lspci("geerlingguy480_quadro_rtx8000_downgraded.txt")["devices"]
    # LnkSta2 ('Current De-emphasis Level') is another register: the link read is LnkSta's
    assert quadro["link_sta"] == {"speed_gts": 5, "width": 1, "speed_downgraded": True, "width_downgraded": True}
    assert below_capable(quadro)


def test_old_lspci_without_width_mark_still_compares_with_lnkcap() -> None:
    (dev,) = _lspci("geerlingguy692_rtx_a4000_speed_downgraded.txt")["devices"]
    assert dev["link_sta"]["width_downgraded"] is False  # 'Width x16' printed without a mark
    assert below_capable(dev)
    at_capability = {**dev, "link_sta": {**dev["link_sta"], "speed_gts": 16, "speed_downgraded": False}}
    assert not below_capable(at_capability)
    narrower = {**at_capability, "link_sta": {**at_capability["link_sta"], "width": 8}}
    assert below_capable(narrower)  # no mark, but x8 of an x16 LnkCap


def test_bridge_acs_flags_and_bus_range() -> None:
    out = _lspci("heymeco6_plx_pex8725_acs.txt")
    port, bridge = out["devices"]
    assert port["bdf"] is None and port["driver"] == "pcieport"
    assert port["acs_ctl"] == {"SrcValid": True, "TransBlk": False, "ReqRedir": True, "CmpltRedir": True,
                               "UpstreamFwd": True, "EgressCtrl": False, "DirectTrans": False}
    assert port["acs_cap"]["EgressCtrl"] is True
    assert bridge["bdf"] == "0000:02:08.0" and bridge["class_name"] == "PCI bridge"
    assert bridge["vendor_id"] is None  # printed without -nn
    assert bridge["name"].startswith("PLX Technology, Inc. PEX 8725") and bridge["rev"] == "ca"
    assert bridge["bus_range"] == {"primary": 0x02, "secondary": 0x82, "subordinate": 0x82}


def test_grepped_acsctl_lines_are_one_device_each() -> None:
    devs = _lspci("nccl523_grep_acsctl.txt")["devices"]
    assert len(devs) == 11
    redirecting = [d for d in devs if d["acs_ctl"]["ReqRedir"] or d["acs_ctl"]["CmpltRedir"]]
    assert len(redirecting) == 5
    assert sum(d["acs_ctl"]["SrcValid"] for d in devs) == 7


@pytest.mark.parametrize("text", ["hello\nworld\n", "LnkCap2: Supported Link Speeds: 2.5-8GT/s\n",
                                  "mlx5_0 port 1 ==> ib0 (Up)\n"])
def test_not_lspci_is_rejected(text: str) -> None:
    with pytest.raises(ParseError, match=r"^lspci: "):
        parse("lspci", text)
