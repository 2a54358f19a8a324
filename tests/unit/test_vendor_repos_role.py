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
    others = ("doca", "os", "slurm", "nhc", "containers")
    assert stale == [f"/etc/apt/keyrings/site-{k}.asc" for k in ("cuda", *others)] + \
        [f"/etc/apt/sources.list.d/site-{k}.sources" for k in others]


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


def _check_task() -> dict:
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    asserts = [t for t in tasks if "ansible.builtin.assert" in t]
    assert len(asserts) == 1 and "loop" not in asserts[0]  # one host result per node
    return asserts[0]


def _check(**given: object) -> tuple[list[bool], str]:
    task = _check_task()
    body = task["ansible.builtin.assert"]
    that = [render_role("vendor_repos", "{{ " + cond + " }}", task_vars=task["vars"], **given)
            for cond in body["that"]]
    return that, str(render_role("vendor_repos", body["fail_msg"], task_vars=task["vars"], **given))


GOOD = {"url": "file:/run/lab/vendor-repo", "key": "k.pub", "suite": "bookworm", "components": ["main"]}


def test_good_repositories_and_pins_pass() -> None:
    assert _check(vendor_repos_cuda=GOOD, nvidia_driver_version="550.90.07", nccl_version="2.21.5")[0] == \
        [True, True, True]


def test_each_malformed_entry_is_named_with_what_it_needs() -> None:
    bad_url = {**GOOD, "url": "ftp://mirror/cuda; rm -rf /"}
    no_key = {k: v for k, v in GOOD.items() if k != "key"}
    that, msg = _check(vendor_repos_cuda=bad_url, vendor_repos_os=no_key, nccl_version="2.21.5 bad",
                       vendor_repos_extra_pins=[{"what": "site", "packages": ["Bad Name"], "version": "1.0"}])
    assert that[:2] == [False, False]
    assert "vendor_repos_cuda is malformed" in msg and "vendor_repos_os is malformed" in msg
    assert "It needs url (http(s):// or file:/), key" in msg
    assert "pin for NCCL is malformed: version 2.21.5 bad" in msg and "pin for site is malformed" in msg


def test_an_offline_site_refuses_internet_repositories() -> None:
    online = {**GOOD, "url": "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/"}
    that, msg = _check(vendor_repos_cuda=online, vendor_repos_offline=True)
    assert that == [True, True, False]
    assert "vendor_repos_offline is true but these repositories are on the internet: https://developer" in msg
    assert _check(vendor_repos_cuda=online, vendor_repos_offline=False)[0] == [True, True, True]
