"""Issue #26 item 4: a broken secrets file is named by file:line:column and the problem, never by its content, and a
run that ends on an error after its journal opened closes the journal (failed, with the reason), never leaving it
`running`."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from provisioner.cli import main
from provisioner.errors import UsageError
from provisioner.phases import RunOptions, StepOutcome, provision_run
from provisioner.runner import FakeRun, PlaybookResult, fake_result, read_secret_file
from provisioner.state import list_runs

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "examples" / "lab" / "cluster.yaml"
PLAYBOOKS = ["preflight.yml", "repos.yml", "ofed.yml", "gpu_stack.yml", "fabric.yml", "storage.yml", "slurm.yml"]
SECRET = "Pr0xy-pa55word-4411"
# an unclosed quote: PyYAML's message quotes the line, the secret with it
BROKEN = f'proxy_user: ops\nproxy_password: "{SECRET}\nother: 1\n'


def test_yaml_error_names_the_place_not_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "secrets.yml"
    bad.write_text(BROKEN)
    with pytest.raises(UsageError) as info:
        read_secret_file(bad)
    text = str(info.value)
    assert SECRET not in text and "Pr0xy" not in text, text  # old: the whole line, secret and all
    assert text.startswith(f"{bad}:2:17: the secrets file is not YAML: "), text


def test_cli_prints_no_secret(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "secrets.yml"
    bad.write_text(BROKEN)
    rc = main(["up", str(LAB), "--secrets", str(bad), "--out", str(tmp_path / "state")])
    cap = capsys.readouterr()
    assert rc == 2
    assert SECRET not in cap.out + cap.err
    assert f"{bad}:2:17:" in cap.err


class SecretsReadingRunner:
    """A scripted run_playbook that reads its secrets files the way the real one does, before each playbook."""

    def __init__(self, break_after: str, secrets: Path) -> None:
        self.break_after, self.secrets = break_after, secrets

    def __call__(self, playbook: Path, inventory_dir: Path, *, limit: Iterable[str],
                 secret_files: Iterable[Path] = (), **kw: Any) -> PlaybookResult:
        for f in secret_files:
            read_secret_file(f)
        if playbook.name == self.break_after:  # someone edits the file while the run goes on
            self.secrets.write_text(BROKEN)
        return fake_result(playbook.name, list(limit), FakeRun())


@pytest.fixture
def playbooks(tmp_path: Path) -> Path:
    d = tmp_path / "playbooks"
    d.mkdir()
    for name in PLAYBOOKS:
        (d / name).write_text("---\n")
    return d


def test_a_load_error_mid_run_closes_the_journal(tmp_path: Path, playbooks: Path) -> None:
    secrets = tmp_path / "secrets.yml"
    secrets.write_text(f"proxy_password: {SECRET}\n")
    quiet = {"verify": lambda ctx: StepOutcome(), "report": lambda ctx: StepOutcome()}
    with pytest.raises(UsageError, match="not YAML"):
        provision_run(LAB, RunOptions(secret_files=[secrets]), state_dir=tmp_path / "st",
                      runner=SecretsReadingRunner("repos.yml", secrets), playbooks_dir=playbooks, steps=quiet)
    [journal] = list_runs(tmp_path / "st")
    assert journal.status == "failed"  # old: "running" until the next run called it dead
    assert journal.ended is not None
    assert journal.stop_reason is not None and "not YAML" in journal.stop_reason
    assert SECRET not in journal.stop_reason
    ofed = journal.phase("ofed")
    assert ofed is not None and ofed.status == "error" and ofed.ended is not None
    repos = journal.phase("repos")
    assert repos is not None and repos.status == "ok"


def test_an_unexpected_error_mid_run_closes_the_journal(tmp_path: Path, playbooks: Path) -> None:
    def boom(ctx: Any) -> StepOutcome:
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        provision_run(LAB, RunOptions(), state_dir=tmp_path / "st", runner=SecretsReadingRunner("-", tmp_path),
                      playbooks_dir=playbooks, steps={"verify": boom, "report": lambda ctx: StepOutcome()})
    [journal] = list_runs(tmp_path / "st")
    assert journal.status == "failed"
    assert journal.stop_reason == "the run ended on an error: RuntimeError: disk on fire"
    verify = journal.phase("verify")
    assert verify is not None and verify.status == "error"


def test_deep_nesting_is_a_one_line_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    deep = tmp_path / "secrets.yml"
    deep.write_text("token: " + "[" * 20000 + "]" * 20000 + "\n")
    with pytest.raises(UsageError, match=r"secrets\.yml:1:\d+: the secrets file is not YAML: .*nests more than"):
        read_secret_file(deep)  # old: RecursionError, exit 3
    rc = main(["up", str(LAB), "--secrets", str(deep), "--out", str(tmp_path / "state")])
    assert rc == 2 and "internal error" not in capsys.readouterr().err
