"""nvidia_peermem's pcie_acs_disable option, rendered (no molecule): the oneshot unit runs the script at every boot,
and the script clears ECAP_ACS+0x6 (NVIDIA's NCCL troubleshooting guide, "PCI Access Control Services") on exactly
the PCI functions whose ACS register setpci can read, run here against stand-in lspci/setpci."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import jinja2
import yaml

ROLE = Path(__file__).resolve().parents[2] / "roles" / "nvidia_peermem"


def _render(template: str) -> str:
    values: dict[str, Any] = {**yaml.safe_load((ROLE / "defaults" / "main.yml").read_text()),
                              "ansible_managed": "Ansible managed"}
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    return env.from_string((ROLE / "templates" / template).read_text()).render(**values)


def test_off_by_default_and_false_removes_what_true_wrote() -> None:
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert defaults["nvidia_peermem_pcie_acs_disable"] is False
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    install = next(t for t in tasks if t.get("ansible.builtin.import_tasks") == "acs.yml")
    assert install["when"] == "nvidia_peermem_pcie_acs_disable | bool"
    remove = next(t for t in tasks if t["name"] == "Remove the ACS unit and script this role wrote")
    assert remove["when"] == "not nvidia_peermem_pcie_acs_disable | bool"
    assert remove["loop"][-2:] == ["/etc/systemd/system/{{ nvidia_peermem_acs_unit }}",
                                   "{{ nvidia_peermem_acs_script }}"]
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    keys = ("nvidia_peermem_pcie_acs_disable", "nvidia_peermem_acs_script", "nvidia_peermem_acs_unit")
    assert {k: specs[k]["default"] for k in keys} == {k: defaults[k] for k in keys}


def test_unit_is_a_boot_oneshot_running_the_script() -> None:
    unit = _render("pcie-acs-disable.service.j2")
    assert "Type=oneshot" in unit and "WantedBy=multi-user.target" in unit
    assert "ExecStart=/usr/local/sbin/provisioner-pcie-acs-disable\n" in unit


def test_script_clears_acs_only_where_the_capability_is(tmp_path: Path) -> None:
    script = tmp_path / "acs.sh"
    script.write_text(_render("pcie-acs-disable.sh.j2"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "setpci.log"
    (bin_dir / "lspci").write_text("#!/bin/sh\nprintf '%s\\n' '0000:00:01.0 PCI bridge: Intel Corporation Device 352a' "
                                   "'0000:18:00.0 PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch' "
                                   "'0000:1b:00.0 3D controller: NVIDIA Corporation Device 2330'\n")
    # the GPU has no ACS capability: reading its register fails, as setpci does for a missing capability
    (bin_dir / "setpci").write_text(f"#!/bin/sh\necho \"$*\" >> {log}\n"
                                    "case \"$*\" in *1b:00.0*) exit 1;; esac\necho 001d\n")
    for tool in ("lspci", "setpci"):
        (bin_dir / tool).chmod(0o755)
    done = subprocess.run(["sh", str(script)], env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    writes = [line for line in log.read_text().splitlines() if "=" in line]
    assert writes == ["-s 0000:00:01.0 ECAP_ACS+0x6.w=0000", "-s 0000:18:00.0 ECAP_ACS+0x6.w=0000"]
