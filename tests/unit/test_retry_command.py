"""The retry command in the run summary: it must paste into a shell as is and find the same run again.

The end-to-end lab test (tests/lab/test_e2e_lab.py) runs the printed command; these cover the shapes it
does not: quoting, and which of the run's options are carried over.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from provisioner.phases import PHASES, RunOptions, provision_run, retry_command, summary_lines
from provisioner.runner import FakeRun, PlaybookResult, fake_result
from provisioner.state import HostProgress, RunJournal

ROOT = Path(__file__).resolve().parents[2]


def journal(options: RunOptions, aside: dict[str, str], spec: str = "cluster.yaml") -> RunJournal:
    hosts = {h: HostProgress(["validate"], {"phase": "ofed", "state": "failed", "reason": r} if r else None)
             for h, r in aside.items()}
    return RunJournal("r1", "c1", spec, ["validate", "ofed"], hosts, options.to_json())


def test_no_set_aside_host_no_command() -> None:
    assert retry_command(journal(RunOptions(), {"gpu01": ""})) is None


def test_hostlist_brackets_are_quoted_so_no_shell_globs_them(tmp_path: Path) -> None:
    j = journal(RunOptions(), {"gpu01": "x", "gpu02": "x", "gpu03": "x", "sm1": ""})
    cmd = retry_command(j)
    assert cmd == "provision cluster.yaml --resume --limit 'gpu[01-03]'"
    # a file that the unquoted pattern would match must not change what the shell passes
    (tmp_path / "gpu0").write_text("")
    words = subprocess.run(["bash", "-c", f"printf '%s\\n' {cmd.removeprefix('provision ')}"], cwd=tmp_path,
                           capture_output=True, text=True, check=True).stdout.split()
    assert words == ["cluster.yaml", "--resume", "--limit", "gpu[01-03]"]


def test_the_options_the_resumed_run_needs_are_carried_over() -> None:
    opts = RunOptions(overlay="/lab dir/overlay.yaml", out="/srv/state", max_fail=50, forks=5, tags=["pkgs", "cfg"],
                      secret_files=[Path("/etc/site/secrets.yml")], vault_password_file=Path("/root/.vault"))
    cmd = retry_command(journal(opts, {"gpu07": "x"}, spec="my cluster.yaml"))
    assert cmd is not None
    assert shlex.split(cmd) == ["provision", "my cluster.yaml", "--resume", "--limit", "gpu07",
                                "--overlay", "/lab dir/overlay.yaml", "--out", "/srv/state", "--forks", "5",
                                "--vault-password-file", "/root/.vault", "--max-fail", "50", "--tags", "pkgs,cfg",
                                "--secrets", "/etc/site/secrets.yml"]


def test_default_max_fail_and_unset_options_stay_out() -> None:
    cmd = retry_command(journal(RunOptions(max_fail=10.0), {"gpu07": "x"}))
    assert cmd == "provision cluster.yaml --resume --limit gpu07"


def test_provision_run_with_a_state_dir_names_it_in_the_retry(tmp_path: Path) -> None:
    """A run whose journal is not in the default .provision/<cluster> must say --out, or --resume finds nothing."""
    spec = ROOT / "examples" / "lab" / "cluster.yaml"
    playbooks = tmp_path / "playbooks"
    playbooks.mkdir()
    for ph in PHASES:
        if ph.playbook:
            (playbooks / ph.playbook).write_text("---\n")

    def runner(playbook: Path, inventory_dir: Path, *, limit: list[str], **kw: object) -> PlaybookResult:
        bad = {"gpu02": "Failed to modprobe nvidia_peermem"} if playbook.name == "ofed.yml" else {}
        return fake_result(playbook.name, list(limit), FakeRun(failed=bad))

    state = tmp_path / "state"
    j = provision_run(spec, RunOptions(max_fail=50), state_dir=state, runner=runner, playbooks_dir=playbooks)
    assert j.set_aside["gpu02"]["phase"] == "ofed"
    cmd = retry_command(j)
    assert cmd is not None and shlex.split(cmd)[-4:] == ["--out", str(state), "--max-fail", "50"]
    assert f"retry them: {cmd}" in summary_lines(j)
    aside = [ln for ln in summary_lines(j) if ln.startswith("  gpu02: failed in ofed: ")]
    assert len(aside) == 1 and "Failed to modprobe nvidia_peermem" in aside[0], summary_lines(j)


def test_a_multi_line_reason_is_one_summary_line() -> None:
    """ssh puts \\r\\n between its messages; the summary keeps one line per set-aside host."""
    j = journal(RunOptions(), {"gpu01": "unreachable at task 'x': mux_client_request_session: Broken pipe\r\n"
                                        "Connection to 10.0.0.1 port 22 timed out"})
    lines = summary_lines(j)
    aside = [ln for ln in lines if ln.startswith("  gpu01: ")]
    assert aside == ["  gpu01: failed in ofed: unreachable at task 'x': mux_client_request_session: Broken pipe "
                     "Connection to 10.0.0.1 port 22 timed out"]
