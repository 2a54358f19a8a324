"""The manifest role's one task per phase: manifest_gather.py --write keeps what the gather, copy, file and
handler tasks guaranteed (same bytes, root 0644 in a root 0755 folder, the change time only on change, a
hand-edited manifest restored, check mode writes nothing and says what would change)."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from ansible.plugins.filter.core import to_nice_json

ROLE = Path(__file__).resolve().parents[2] / "roles" / "manifest"
DOC = {"schema": 1, "hostname": "gpu01", "packages": {"libnccl2": "2.21.5-1+cuda12.4"}, "os": {"NAME": "Débian"},
       "holds": ["libnccl2"], "hcas": {}, "cgroup": None}
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the gatherer makes its files root's (chown 0:0)")


def _gather() -> ModuleType:
    spec = importlib.util.spec_from_file_location("manifest_gather", ROLE / "files" / "manifest_gather.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_bytes_are_what_the_copy_task_wrote() -> None:
    """A node converged by the earlier role must not see its manifest rewritten (nor its change time moved)."""
    assert _gather().manifest_text(DOC) == to_nice_json(DOC, indent=2, sort_keys=True) + "\n"


def test_check_mode_writes_nothing_and_says_it_would(tmp_path: Path) -> None:
    path = tmp_path / "lib" / "manifest.json"
    assert _gather().record(DOC, str(path), str(tmp_path / "lib" / "changed"), check=True) is True
    assert not (tmp_path / "lib").exists()


@root_only
def test_first_write_then_no_change_then_a_hand_edit_is_restored(tmp_path: Path) -> None:
    gather = _gather()
    folder = tmp_path / "lib"
    path, when = folder / "manifest.json", folder / "changed"
    assert gather.record(DOC, str(path), str(when), check=False) is True
    assert (json.loads(path.read_text()), _mode(path), _mode(folder)) == (DOC, 0o644, 0o755)
    stamp = when.read_text()
    assert stamp.endswith("Z\n")
    when.write_text("earlier\n")
    assert gather.record(DOC, str(path), str(when), check=False) is False
    assert gather.record(DOC, str(path), str(when), check=True) is False
    assert when.read_text() == "earlier\n"  # no change, no new time
    path.write_text(path.read_text().replace("2.21.5", "9.9.9"))  # by hand
    assert gather.record(DOC, str(path), str(when), check=True) is True
    assert "9.9.9" in path.read_text()  # check mode only said so
    assert gather.record(DOC, str(path), str(when), check=False) is True
    assert json.loads(path.read_text()) == DOC and when.read_text() != "earlier\n"


@root_only
def test_a_wrong_mode_is_a_change_and_is_fixed(tmp_path: Path) -> None:
    gather = _gather()
    path = tmp_path / "manifest.json"
    gather.record(DOC, str(path), None, check=False)
    path.chmod(0o600)
    (tmp_path).chmod(0o755)
    assert gather.record(DOC, str(path), None, check=True) is True and _mode(path) == 0o600
    assert gather.record(DOC, str(path), None, check=False) is True and _mode(path) == 0o644
    assert gather.record(DOC, str(path), None, check=False) is False


def test_the_role_is_one_check_and_one_task_on_the_node() -> None:
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    assert [next(k for k in t if k.startswith("ansible.builtin.")) for t in tasks] == [
        "ansible.builtin.assert", "ansible.builtin.script"]
    script = tasks[1]
    assert "--write {{ manifest_path | quote }}" in script["ansible.builtin.script"]["cmd"]
    assert "'--check' if ansible_check_mode" in script["ansible.builtin.script"]["cmd"]
    assert (script["check_mode"], script["register"]) == (False, "manifest_written")
    assert not (ROLE / "handlers").exists()


def test_options_before_the_patterns_are_read_as_options() -> None:
    opts, keys, patterns = _gather().parse_args(["--module-regex", "^x$", "--mlxconfig-key", "SRIOV_EN",
                                                 "--mlxconfig-key", "bad key", "--write", "/m.json",
                                                 "--time-path", "/m.changed", "--check", "libnccl2", "nfs-*"])
    assert opts == {"--module-regex": "^x$", "--write": "/m.json", "--time-path": "/m.changed", "--check": "1"}
    assert (keys, patterns) == (["SRIOV_EN"], ["libnccl2", "nfs-*"])
