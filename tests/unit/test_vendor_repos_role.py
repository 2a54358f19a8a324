"""vendor_repos (unit level; molecule/vendor_repos runs it): the stale files one `find` looks for, and the APT
hook that makes cache_valid_time read the lists' true age."""

from __future__ import annotations

from pathlib import Path

import yaml
from ansible.modules import apt as apt_module

from tests.unit._role_render import render_role

ROLE = Path(__file__).resolve().parents[2] / "roles" / "vendor_repos"


def test_stale_files_are_every_asc_keyring_and_the_sources_of_repositories_not_named() -> None:
    cuda = {"url": "file:/r", "key": "k", "suite": "/"}
    stale = render_role("vendor_repos", "{{ vendor_repos_stale_files }}", vendor_repos_cuda=cuda,
                        vendor_repos_file_prefix="site")
    assert stale == [f"/etc/apt/keyrings/site-{k}.asc" for k in ("cuda", "doca", "os", "slurm", "nhc")] + \
        [f"/etc/apt/sources.list.d/site-{k}.sources" for k in ("doca", "os", "slurm", "nhc")]


def test_the_find_removes_only_the_stale_paths_it_found() -> None:
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    by_name = {t["name"]: t for t in tasks}
    find = by_name["Find the keyrings and sources this role wrote earlier that are stale now"]
    remove = by_name["Remove the stale keyrings and sources"]
    assert find["register"] == "vendor_repos_stale_found"
    assert "select('in', vendor_repos_stale_files)" in remove["loop"]  # a same-named file elsewhere is kept
    assert remove["notify"] == "Refresh the apt cache"
    assert not [t for t in tasks if "loop" in t and "ansible.builtin.file" in t and t is not remove]


def test_every_successful_update_stamps_the_lists_age_for_cache_valid_time() -> None:
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    hook = next(t for t in tasks if str(t.get("ansible.builtin.copy", {}).get("dest", "")).startswith(
        "/etc/apt/apt.conf.d/"))
    content = hook["ansible.builtin.copy"]["content"]
    assert "APT::Update::Post-Invoke-Success" in content
    assert f"touch {apt_module.APT_UPDATE_SUCCESS_STAMP_PATH}" in content  # what cache_valid_time reads first
    assert hook["notify"] == "Refresh the apt cache"
