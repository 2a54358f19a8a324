"""run_playbook through the real ansible-runner, against local hosts (connection local) and a refused SSH port.

One playbook run (module fixture) serves most tests: host alpha passes, beta fails a task, gamma is
unreachable (SSH to 127.0.0.1 port 1, refused), and a planted secret from a vars file is printed by a
`no_log` task and leaked by a plain debug task: the artifacts must not contain it anywhere.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from provisioner.collection import ContentMissing
from provisioner.errors import UsageError
from provisioner.quiet_warnings import pythonwarnings
from provisioner.runner import (
    REDACTED,
    PlaybookResult,
    ansible_settings,
    build_cmdline,
    control_path_dir,
    filter_env,
    read_secret_file,
    redact_obj,
    redact_text,
    run_playbook,
    scrub_artifacts,
    secret_values,
    summarize_events,
)

SECRET = "Zq9-planted-SECRET-7781"
ROOT = Path(__file__).resolve().parents[2]
ROLES = ROOT / "roles"
PLAYBOOKS_DIR = ROOT / "playbooks"

INVENTORY = """\
all:
  vars:
    ansible_python_interpreter: "{{ ansible_playbook_python }}"
  hosts:
    alpha: {ansible_connection: local}
    beta: {ansible_connection: local}
    gamma: {ansible_connection: ssh, ansible_host: 127.0.0.1, ansible_port: 1, ansible_user: nobody}
"""

PLAYBOOK = """\
- name: Tiny play
  hosts: all
  gather_facts: false
  tasks:
    - name: Reach the host
      ansible.builtin.ping:
    - name: Use the secret quietly
      ansible.builtin.debug:
        msg: "quiet {{ db_password }}"
      no_log: true
    - name: Leak the secret
      ansible.builtin.debug:
        msg: "leaked {{ db_password }}"
    - name: Touch a marker
      ansible.builtin.copy:
        dest: "{{ marker_dir }}/{{ inventory_hostname }}"
        content: "x"
        mode: "0644"
      tags: [marker]
    - name: Break beta
      ansible.builtin.fail:
        msg: beta is broken on purpose
      when: inventory_hostname == 'beta'
"""


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("runner")
    (d / "inventory.yml").write_text(INVENTORY)
    (d / "site.yml").write_text(PLAYBOOK)
    (d / "secrets.yml").write_text(f"db_password: {SECRET}\n")
    (d / "markers").mkdir()
    return d


@pytest.fixture(scope="module")
def run(workdir: Path) -> Iterator[tuple[PlaybookResult, list[dict[str, Any]]]]:
    events: list[dict[str, Any]] = []
    result = run_playbook(workdir / "site.yml", workdir / "inventory.yml", private_data_dir=workdir / "pdd",
                          secret_files=[workdir / "secrets.yml"], extravars={"marker_dir": str(workdir / "markers")},
                          event_handler=events.append, forks=3, state_dir=workdir / "state", ident="phase1")
    yield result, events


def test_host_summary(run: tuple[PlaybookResult, list[dict[str, Any]]]) -> None:
    result, _ = run
    assert result.ok_hosts == ["alpha"]
    assert result.failed_hosts == ["beta"]
    assert result.unreachable_hosts == ["gamma"]
    assert result.status == "failed" and result.rc != 0 and result.error is None
    beta = result.hosts["beta"]
    assert beta.failed_task == "Break beta"
    assert beta.message == "beta is broken on purpose"
    assert "Break beta" in beta.reason
    gamma = result.hosts["gamma"]
    assert gamma.failed_task == "Reach the host"
    assert "port 1" in (gamma.message or "") or "refused" in (gamma.message or "").lower()
    assert result.hosts["alpha"].changed == 1  # the marker copy


def test_events_reach_the_handler_redacted(run: tuple[PlaybookResult, list[dict[str, Any]]]) -> None:
    _, events = run
    kinds = {e.get("event") for e in events}
    assert {"playbook_on_start", "runner_on_ok", "runner_on_failed", "runner_on_unreachable",
            "playbook_on_stats"} <= kinds
    leak = [e for e in events if e.get("event") == "runner_on_ok"
            and e["event_data"].get("task") == "Leak the secret"]
    assert leak and all(e["event_data"]["res"]["msg"] == f"leaked {REDACTED}" for e in leak)
    assert SECRET not in json.dumps(events)


def test_no_artifact_holds_the_secret(run: tuple[PlaybookResult, list[dict[str, Any]]]) -> None:
    result, _ = run
    assert result.artifact_dir is not None and result.artifact_dir.name == "phase1"
    files = [p for p in result.artifact_dir.parent.parent.rglob("*") if p.is_file()]
    assert any(p.name == "stdout" for p in files) and any("job_events" in p.parts for p in files)
    leaking = [p for p in files if SECRET.encode() in p.read_bytes()]
    assert leaking == []
    stdout = (result.artifact_dir / "stdout").read_text()
    assert f"leaked {REDACTED}" in stdout  # the leak happened and was scrubbed, not skipped
    assert not (result.artifact_dir.parent.parent / "env").exists()  # suppress_env_files


def test_third_party_deprecation_warnings_stay_out_of_the_run_output(
        run: tuple[PlaybookResult, list[dict[str, Any]]]) -> None:
    """cryptography 51 warns on the DSA import ansible-core makes at every start; the run's output shows the play
    and its real failures, not that (nor the environment's path, which the warning carried)."""
    result, _ = run
    assert result.artifact_dir is not None
    stdout = (result.artifact_dir / "stdout").read_text()
    assert "beta is broken on purpose" in stdout and "PLAY RECAP" in stdout
    assert "Warning:" not in stdout and "DSA is deprecated" not in stdout and "site-packages" not in stdout


def test_the_warning_filter_is_narrow(tmp_path: Path) -> None:
    """The filter quiets the one import site it names: the same warning from any other module still shows, and an
    operator's PYTHONWARNINGS comes last, so PYTHONWARNINGS=default shows everything again."""
    env = {**os.environ, "PYTHONWARNINGS": pythonwarnings({})}
    code = ("import warnings, cryptography.utils as u\n"
            "import ansible._internal._ssh._ssh_agent\n"
            "warnings.warn('elsewhere', u.CryptographyDeprecationWarning)\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                          cwd=tmp_path)
    assert "DSA is deprecated" not in done.stderr
    assert "CryptographyDeprecationWarning: elsewhere" in done.stderr
    env["PYTHONWARNINGS"] = pythonwarnings({"PYTHONWARNINGS": "default"})
    mine = subprocess.run([sys.executable, "-c", "import ansible._internal._ssh._ssh_agent"], env=env,
                          capture_output=True, text=True, check=True, cwd=tmp_path)
    assert "DSA is deprecated" in mine.stderr  # the lock's cryptography warns there: the operator's `default` won


def test_recorded_command_has_paths_not_values(run: tuple[PlaybookResult, list[dict[str, Any]]],
                                               workdir: Path) -> None:
    result, _ = run
    assert result.artifact_dir is not None
    doc = json.loads((result.artifact_dir / "command").read_text())
    assert f"@{workdir / 'secrets.yml'}" in doc["command"]
    assert doc["env"]["ANSIBLE_HOST_KEY_CHECKING"] == "True"
    assert doc["env"]["ANSIBLE_CACHE_PLUGIN_CONNECTION"] == str((workdir / "state" / "facts").resolve())
    assert all(k.startswith(("ANSIBLE_", "AWX_", "RUNNER_")) or k in {"PATH", "HOME", "LANG", "LC_ALL", "USER",
               "PYTHONPATH", "VIRTUAL_ENV", "SHELL", "TERM"} for k in doc["env"])
    cfg = (result.artifact_dir.parent.parent / "ansible.cfg").read_text()
    assert "pipelining = True" in cfg and "ControlPersist=60s" in cfg and "host_key_checking = True" in cfg


def test_tags_and_check_mode(workdir: Path) -> None:
    out = workdir / "markers2"
    out.mkdir()
    result = run_playbook(workdir / "site.yml", workdir / "inventory.yml", private_data_dir=workdir / "pdd2",
                          secret_files=[workdir / "secrets.yml"], extravars={"marker_dir": str(out)}, tags=["marker"],
                          limit=["alpha"], check=True, diff=True, state_dir=workdir / "state")
    assert list(result.hosts) == ["alpha"] and result.ok_hosts == ["alpha"]
    assert result.hosts["alpha"].changed == 1  # check mode reports the change ...
    assert list(out.iterdir()) == []             # ... without making it
    assert result.artifact_dir is not None
    cmd = json.loads((result.artifact_dir / "command").read_text())["command"]
    assert "--check" in cmd and "--diff" in cmd and "marker" in cmd and "alpha" in cmd


def test_a_playbook_that_cannot_run_is_an_error(workdir: Path) -> None:
    bad = workdir / "bad.yml"
    bad.write_text("- hosts: all\n  tasks:\n    - name: x\n      no_such_module_here: {}\n")
    result = run_playbook(bad, workdir / "inventory.yml", private_data_dir=workdir / "pdd3", limit="alpha")
    assert result.hosts == {} and result.error
    assert result.status == "failed"


def test_secret_in_extravars_is_refused(workdir: Path) -> None:
    with pytest.raises(UsageError, match="holds a secret"):
        run_playbook(workdir / "site.yml", workdir / "inventory.yml", private_data_dir=workdir / "pdd4",
                     secret_files=[workdir / "secrets.yml"], extravars={"oops": SECRET})


def test_missing_playbook_and_inventory(workdir: Path) -> None:
    with pytest.raises(ContentMissing, match=r"nope\.yml is missing"):
        run_playbook(workdir / "nope.yml", workdir / "inventory.yml", private_data_dir=workdir / "x")
    with pytest.raises(UsageError, match="render"):
        run_playbook(workdir / "site.yml", workdir / "noinv", private_data_dir=workdir / "x")


# --- pure parts ------------------------------------------------------------------------------------------

def test_summarize_ignored_errors_do_not_fail() -> None:
    events = [
        {"event": "runner_on_failed", "event_data": {"host": "a", "task": "t", "ignore_errors": True,
                                                     "res": {"msg": "meh"}}},
        {"event": "runner_on_ok", "event_data": {"host": "a", "task": "u", "res": {"changed": True}}},
    ]
    hosts = summarize_events(events)
    assert hosts["a"].state == "ok" and hosts["a"].ignored == 1 and hosts["a"].changed == 1


def test_summarize_loop_failure_message() -> None:
    events = [{"event": "runner_on_failed", "event_data": {"host": "a", "task": "loop", "res": {
        "msg": "One or more items failed", "results": [
            {"failed": False}, {"failed": True, "msg": "item two broke\nsecond line"},
            {"failed": True, "msg": "item three broke"}]}}}]
    assert summarize_events(events)["a"].message == "item two broke (and 1 more item(s))"


def test_redaction_covers_escaped_forms() -> None:
    s = 'pa"ss\\word'
    text = json.dumps({"m": f"x {s} y"}) + " raw " + s
    out = redact_text(text, [s])
    assert s not in out and json.dumps(s)[1:-1] not in out and out.count(REDACTED) == 2
    assert redact_text("abc", ["ab"]) == "abc"  # too short to scrub safely
    assert redact_obj({"k": ["has sekret1 in it"], "sekret1": 1}, frozenset({"sekret1"})) == {
        "k": [f"has {REDACTED} in it"], REDACTED: 1}


def test_secret_values_and_files(tmp_path: Path) -> None:
    assert secret_values({"a": "longsecret", "b": ["another1", {"c": 123456}], "d": True, "e": None}) == {
        "longsecret", "another1", "123456"}
    vault = tmp_path / "vault.yml"
    vault.write_text("$ANSIBLE_VAULT;1.1;AES256\n3530\n")
    assert read_secret_file(vault) == set()
    with pytest.raises(UsageError):
        read_secret_file(tmp_path / "missing.yml")


def test_scrub_artifacts_filters_env(tmp_path: Path) -> None:
    (tmp_path / "command").write_text(json.dumps({"command": ["x"], "env": {
        "AWS_SECRET_ACCESS_KEY": "abcd1234", "ANSIBLE_FORKS": "5", "PATH": "/bin"}}))
    (tmp_path / "stdout").write_text("token hunter2hunter2 here")
    changed = scrub_artifacts(tmp_path, ["hunter2hunter2"])
    assert {p.name for p in changed} == {"command", "stdout"}
    assert json.loads((tmp_path / "command").read_text())["env"] == {"ANSIBLE_FORKS": "5", "PATH": "/bin"}
    assert (tmp_path / "stdout").read_text() == f"token {REDACTED} here"
    assert filter_env({"GITHUB_TOKEN": "x", "ANSIBLE_X": "y"}) == {"ANSIBLE_X": "y"}


def test_settings_and_cmdline(tmp_path: Path) -> None:
    s = ansible_settings(tmp_path, forks=7)
    assert s["defaults"]["forks"] == "7" and s["defaults"]["host_key_checking"] == "True"
    assert s["defaults"]["fact_caching_connection"] == str(tmp_path.resolve() / "facts")
    assert "ControlMaster=auto" in s["ssh_connection"]["ssh_args"]
    assert build_cmdline(check=True, diff=False, secret_files=[Path("/v/s.yml")], vault_password_file=None) == \
        "--check -e @/v/s.yml"
    deep = tmp_path / ("d" * 90)
    assert control_path_dir(deep) == Path.home() / ".ansible" / "cp"


DELEGATING_PLAYBOOK = """\
- name: A node reads from its peers, one of which is down
  hosts: alpha
  gather_facts: false
  tasks:
    - name: Read from every member
      ansible.builtin.command: "true"
      delegate_to: "{{ item }}"
      run_once: true
      ignore_unreachable: true
      ignore_errors: true
      loop: [gamma]
    - name: Go on
      ansible.builtin.debug:
        msg: alpha carried on
- name: A rescued failure
  hosts: beta
  gather_facts: false
  tasks:
    - block:
        - name: Fail once
          ansible.builtin.fail:
            msg: first try
      rescue:
        - name: Recover
          ansible.builtin.debug:
            msg: recovered
"""


def test_an_ignored_unreachable_delegate_and_a_rescued_failure_leave_the_host_ok(workdir: Path) -> None:
    """Real ansible-core sends runner_on_unreachable for alpha when its delegated read of gamma (refused SSH)
    fails under ignore_unreachable, and runner_on_failed for beta's rescued task; the play recap counts both hosts
    ok. The lab's e2e run set its SM node aside this way when a partition member was paused."""
    playbook = workdir / "delegate.yml"
    playbook.write_text(DELEGATING_PLAYBOOK)
    events: list[dict[str, Any]] = []
    result = run_playbook(playbook, workdir / "inventory.yml", private_data_dir=workdir / "pdd-delegate",
                          event_handler=events.append, forks=3, state_dir=workdir / "state", ident="delegate")
    kinds = {(e.get("event"), (e.get("event_data") or {}).get("host")) for e in events}
    assert ("runner_on_unreachable", "alpha") in kinds and ("runner_on_failed", "beta") in kinds
    assert result.hosts["alpha"].state == "ok" and result.hosts["alpha"].ignored == 1, result.hosts["alpha"]
    assert result.hosts["beta"].state == "ok" and result.hosts["beta"].rescued == 1, result.hosts["beta"]
    assert result.hosts["alpha"].reason == "" and result.hosts["alpha"].failed_task is None
    assert sorted(result.ok_hosts) == ["alpha", "beta"] and result.status == "successful"


RESCUE_THEN_FAIL_PLAYBOOK = """\
- name: Two daemons that do not come up
  hosts: alpha:beta
  gather_facts: false
  tasks:
    - name: Wait for a daemon
      ansible.builtin.command: echo State=DOWN
      register: wait
      changed_when: false
      retries: 2
      delay: 0
      until: "'IDLE' in wait.stdout"
      when: inventory_hostname == 'alpha'
    - when: inventory_hostname == 'beta'
      block:
        - name: Wait for a daemon
          ansible.builtin.command: echo State=DOWN
          register: wait
          changed_when: false
          retries: 2
          delay: 0
          until: "'IDLE' in wait.stdout"
      rescue:
        - name: Say why
          ansible.builtin.fail:
            msg: the daemon exited at start
"""


def test_a_host_that_fails_in_its_rescue_is_reported_by_that_failure(workdir: Path) -> None:
    """Real ansible-core sends runner_on_failed for the rescued task and again for the rescue's failure: the host is
    reported by the last one (the slurm role's rescue names slurmd's own error). An `until:` loop that runs out
    has no msg and the exception text "(traceback unavailable)": its report says so and shows the last output."""
    playbook = workdir / "rescue.yml"
    playbook.write_text(RESCUE_THEN_FAIL_PLAYBOOK)
    result = run_playbook(playbook, workdir / "inventory.yml", private_data_dir=workdir / "pdd-rescue",
                          forks=3, state_dir=workdir / "state", ident="rescue")
    beta, alpha = result.hosts["beta"], result.hosts["alpha"]
    assert beta.state == "failed" and beta.failed_task == "Say why", beta
    assert beta.message == "the daemon exited at start"
    assert alpha.state == "failed" and alpha.failed_task == "Wait for a daemon", alpha
    assert alpha.message == "still not done after 2 attempts (last output: State=DOWN)", alpha.message


def test_runs_do_not_inherit_the_package_collections_path(tmp_path: Path) -> None:
    """A playbook inside a configured collections path runs as collection content, whose roles lose the plugins
    they carry: the runs drop the directory `provision collection-path` tells people to export, keep the rest."""
    from provisioner.collection import collections_root
    from provisioner.runner import collections_path_env

    ours = str(collections_root())
    env = {"ANSIBLE_COLLECTIONS_PATH": ":".join([str(tmp_path), ours, ours + "/ansible_collections"]),
           "ANSIBLE_COLLECTIONS_PATHS": ours, "HOME": "/root"}
    assert collections_path_env(env) == {
        "ANSIBLE_COLLECTIONS_PATH": str(tmp_path),
        "ANSIBLE_COLLECTIONS_PATHS": "~/.ansible/collections:/usr/share/ansible/collections"}
    assert collections_path_env({"HOME": "/root"}) == {}


def test_a_template_in_an_extra_var_is_refused_not_run(tmp_path: Path) -> None:
    """Extra vars reach ansible as JSON on the command line, where ansible-core treats them as trusted templates;
    they are built from the spec and the state directory (slurm_failed comes from the swap record), so a
    `{{ lookup('pipe', ...) }}` there would run on the control node. Refused, naming the variable (was: ran)."""
    (tmp_path / "inventory.yml").write_text("all: {hosts: {alpha: {ansible_connection: local}}}\n")
    (tmp_path / "site.yml").write_text("- hosts: all\n  gather_facts: false\n  tasks:\n"
                                       "    - ansible.builtin.debug: {var: slurm_failed}\n")
    marker = tmp_path / "ran"
    with pytest.raises(UsageError, match=r"extra var 'slurm_failed' holds a template"):
        run_playbook(tmp_path / "site.yml", tmp_path / "inventory.yml", private_data_dir=tmp_path / "pdd",
                     extravars={"slurm_failed": ["gpu01", "{{ lookup('pipe', 'touch " + str(marker) + "') }}"]})
    assert not marker.exists()
    plain = run_playbook(tmp_path / "site.yml", tmp_path / "inventory.yml", private_data_dir=tmp_path / "pdd",
                         extravars={"slurm_failed": ["gpu01"], "provisioner_reboot_serial": 2})
    assert plain.ok_hosts == ["alpha"], plain.error


def _role_setup_task(role: str) -> dict[str, Any]:
    """The role's own fact-gathering task, as shipped (roles gather facts themselves; plays gather none)."""
    import yaml

    tasks = yaml.safe_load((ROLES / role / "tasks" / "main.yml").read_text())
    task = next(t for t in tasks if "ansible.builtin.setup" in t)
    return {"name": task["name"], "ansible.builtin.setup": task["ansible.builtin.setup"]}


def test_fact_cache_is_private_and_keeps_no_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #26 item 4: the cache held ansible_env (a proxy password in the operator's environment) in a 0755
    directory of 0640 files. Run the preflight role's setup task for real on a local host."""
    import yaml

    planted = "http://ops:Zq9-proxy-SECRET-5521@proxy.example:3128"
    monkeypatch.setenv("https_proxy", planted)
    (tmp_path / "inventory.yml").write_text(INVENTORY)
    play = [{"name": "Facts", "hosts": "alpha", "gather_facts": False, "tasks": [_role_setup_task("preflight")]}]
    (tmp_path / "facts.yml").write_text(yaml.safe_dump(play))
    state = tmp_path / "state"
    result = run_playbook(tmp_path / "facts.yml", tmp_path / "inventory.yml", private_data_dir=tmp_path / "pdd",
                          state_dir=state, ident="facts")
    assert result.ok_hosts == ["alpha"], result
    facts_dir = state / "facts"
    cached = [p for p in facts_dir.iterdir() if p.is_file()]
    assert len(cached) == 1 and cached[0].name.endswith("alpha")  # ansible-core 2.19 names it s1_alpha
    assert stat.S_IMODE(facts_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(cached[0].stat().st_mode) == 0o600
    doc = json.loads(cached[0].read_text())
    facts = json.loads(doc["__payload__"]) if "__payload__" in doc else doc  # 2.19 wraps the facts in a payload
    assert "ansible_distribution" in facts  # the role still gets its OS facts
    assert "ansible_env" not in facts and planted not in cached[0].read_text()


def test_an_existing_fact_dir_is_made_private(tmp_path: Path) -> None:
    (tmp_path / "state" / "facts").mkdir(parents=True, mode=0o755)
    old = tmp_path / "state" / "facts" / "alpha"
    old.write_text("{}")
    old.chmod(0o644)
    (tmp_path / "inventory.yml").write_text(INVENTORY)
    (tmp_path / "noop.yml").write_text("- hosts: alpha\n  gather_facts: false\n  tasks: []\n")
    run_playbook(tmp_path / "noop.yml", tmp_path / "inventory.yml", private_data_dir=tmp_path / "pdd",
                 state_dir=tmp_path / "state", ident="noop")
    assert stat.S_IMODE((tmp_path / "state" / "facts").stat().st_mode) == 0o700
    assert stat.S_IMODE(old.stat().st_mode) == 0o600


def test_every_fact_gathering_leaves_out_the_environment() -> None:
    """Each setup task of a role and each play that gathers facts excludes the env subset (min includes it)."""
    import yaml

    found = 0
    for path in sorted(ROLES.glob("*/tasks/*.yml")) + sorted(PLAYBOOKS_DIR.glob("*.yml")):
        for item in yaml.safe_load(path.read_text()) or []:
            args = item.get("ansible.builtin.setup", item.get("setup"))
            if args is not None:
                found += 1
                assert "!env" in (args or {}).get("gather_subset", []), f"{path}: {item.get('name')}"
            if item.get("hosts") is not None and item.get("gather_facts", True):
                assert "!env" in item.get("gather_subset", []), f"{path}: play {item.get('name')} gathers env"
    assert found >= 12
