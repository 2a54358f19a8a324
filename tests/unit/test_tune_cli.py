"""`provision tune` on the command line: the table, the recommendation and its spec snippet, could not run with the
reason, a bad --knobs in one line; the sweep itself (verify.tune_nccl) is faked here and tested in test_tune.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from provisioner import verify
from provisioner.cli import main
from provisioner.fabric.tune import Sample, Setting

SPEC = Path(__file__).resolve().parents[2] / "examples" / "a100-hdr-4node.yaml"
QPS = "NCCL_IB_QPS_PER_CONNECTION"


def _fake(monkeypatch: pytest.MonkeyPatch, run: verify.TuneRun, seen: dict[str, Any]) -> None:
    def tune_nccl(cluster: Any, **kwargs: Any) -> verify.TuneRun:
        seen.update(kwargs, cluster=cluster.name)
        return run

    monkeypatch.setattr(verify, "tune_nccl", tune_nccl)


def _setting(env: dict[str, str], figures: list[float]) -> Setting:
    return Setting(env, [Sample(f, taken=dict(env)) for f in figures])


def test_a_setting_beyond_the_spread_is_printed_with_its_snippet_and_nothing_else_happens(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    seen: dict[str, Any] = {}
    run = verify.TuneRun([_setting({}, [90.0, 90.5, 89.8]), _setting({QPS: "4"}, [99.0, 99.4, 98.9])])
    _fake(monkeypatch, run, seen)
    assert main(["tune", str(SPEC), "--knobs", QPS, "--repeats", "3", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["setting", "median"]
    assert lines[1].startswith("NCCL defaults") and lines[2].startswith(f"{QPS}=4")
    assert f"Recommended: {QPS}=4 (+10.0% over the defaults' median, beyond the spread)." in out
    assert out.endswith(f'software:\n  nccl_env:\n    {QPS}: "4"\n')
    assert seen["knobs"] == [QPS] and seen["repeats"] == 3 and seen["include_busy"] is False


def test_no_winner_keeps_the_defaults_and_could_not_run_says_why_with_exit_2(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _fake(monkeypatch, verify.TuneRun([_setting({}, [90.0, 91.0]), _setting({QPS: "2"}, [90.5, 90.2])]), {})
    assert main(["tune", str(SPEC), "--out", str(tmp_path)]) == 0
    assert "No setting beat NCCL's defaults by more than the run-to-run spread: keep the defaults." in \
        capsys.readouterr().out
    busy = "the GPU compute nodes run Slurm jobs (left out: n1: Slurm runs job 41 on n1)"
    _fake(monkeypatch, verify.TuneRun([], busy), {})
    assert main(["tune", str(SPEC), "--out", str(tmp_path)]) == 2
    assert f"NOT RUN tune: {busy}" in capsys.readouterr().out


def test_an_unknown_knob_is_one_line_and_nothing_runs(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    seen: dict[str, Any] = {}
    _fake(monkeypatch, verify.TuneRun([]), seen)
    assert main(["tune", str(SPEC), "--knobs", "NCCL_BOGUS", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unknown NCCL_BOGUS" in err and "Traceback" not in err
    assert not seen
