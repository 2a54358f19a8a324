"""doca_ofed's ofed_version.yml: one set_fact gives the reported version and whether it matches the pin, as the
file's header describes (real ofed_info outputs drop or add build fields)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.unit._role_render import render_role

TASKS = Path(__file__).resolve().parents[2] / "roles" / "doca_ofed" / "tasks" / "ofed_version.yml"
DOCA = {"ofed_info_prefix": "OFED-internal-"}


def _facts(stdout_lines: list[str], expected: str, profile: dict[str, str]) -> tuple[object, object]:
    tasks = yaml.safe_load(TASKS.read_text())
    facts = [t for t in tasks if "ansible.builtin.set_fact" in t]
    assert len(facts) == 1
    task = facts[0]
    given = {"doca_ofed_info": {"stdout_lines": stdout_lines}, "doca_ofed_expected": expected,
             "doca_ofed_profile": profile}
    sf = task["ansible.builtin.set_fact"]
    return (render_role("doca_ofed", sf["doca_ofed_reported"], task_vars=task["vars"], **given),
            render_role("doca_ofed", sf["doca_ofed_matches"], task_vars=task["vars"], **given))


@pytest.mark.parametrize(("lines", "expected", "reported", "matches"), [
    (["OFED-internal-24.10-1.1.4.0.200:"], "24.10-1.1.4.0", "24.10-1.1.4.0.200", True),
    (["OFED-internal-24.04-0.6.6"], "24.04-0.6.6.0", "24.04-0.6.6", True),
    (["OFED-internal-24.07-0.6.1.0"], "24.10-1.1.4.0", "24.07-0.6.1.0", False),
    (["MLNX_OFED_LINUX-24.10-1.1.4.0"], "24.10-1.1.4.0", "", False),  # another flavour
    (["OFED-internal-24.10"], "24.10", "24.10", False),  # under X.Y-A.B.C nothing is known to match
    ([], "24.10-1.1.4.0", "", False),  # no ofed_info at all
])
def test_reported_and_matches(lines: list[str], expected: str, reported: str, matches: bool) -> None:
    assert _facts(lines, expected, DOCA) == (reported, matches)
