"""Node-reported text never reaches the operator's terminal with control sequences in it (issue #26).

A node, a switch or a tool can answer with OSC 52 (writes the terminal's clipboard), CSI (moves the cursor,
recolours), C1 controls or bidi overrides: provisioner.safetext.printable shows them escaped, and every printer of
node text (verify's findings and could-not-run lines, the spec diagnostics, discover) goes through it.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import provisioner.verify
from provisioner.cli import main
from provisioner.fabric.findings import CheckResult, Finding
from provisioner.report.model import VerifyReport
from provisioner.safetext import printable
from provisioner.verify import VerifyRun

ROOT = Path(__file__).resolve().parents[2]
OSC52 = "\x1b]52;c;Y3VybCBldmlsIHwgc2g=\x07"
CSI = "\x1b[2J\x1b[1;1H"
C1 = "\x9b31m"
#: what must never be printed: C0 controls but newline and tab, DEL, C1 controls, bidi overrides
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


@pytest.mark.parametrize(("text", "want"), [
    (f"mlx5_0{OSC52}", "mlx5_0\\x1b]52;c;Y3VybCBldmlsIHwgc2g=\\x07"),
    (f"red{CSI}", "red\\x1b[2J\\x1b[1;1H"),
    (f"{C1}x", "\\x9b31mx"),
    ("6.1\nverify: {tests: []}\r\nreboot: x", "6.1 verify: {tests: []} reboot: x"),
    ("\u202etxt.exe", "\\u202etxt.exe"),
    ("plain 6.1.0-28-amd64 \"#}", "plain 6.1.0-28-amd64 \"#}"),
])
def test_printable_escapes_every_control_and_folds_lines(text: str, want: str) -> None:
    assert printable(text) == want
    assert not UNSAFE.search(printable(text)) and "\n" not in printable(text)


def test_printable_caps_the_length() -> None:
    assert printable("x" * 500, 160) == "x" * 159 + "…"
    assert printable("short", 160) == "short"


def test_verify_prints_no_control_sequence_a_node_reported(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A finding's message and a could-not-run reason carry what a node printed (ibstat, nvidia-smi): the CLI
    shows them escaped on one line. Failed before the fix: the ESC, BEL and C1 bytes went to the terminal."""
    now = datetime.now(UTC)
    finding = Finding("links", "error", "gpu01", "mlx5_0", 1, "Active", f"Down{OSC52}",
                      f"port state Down{OSC52}\nINJECTED line", "check the cable")
    checks = (CheckResult("links", "gpu01", False, (finding,)),
              CheckResult("gpudirect", "gpu02", False, error=f"nvidia-smi: {CSI}{C1}failed"))
    report = VerifyReport("lab", now, now, checks)
    monkeypatch.setattr(provisioner.verify, "verify", lambda *a, **k: VerifyRun(report, tmp_path))
    rc = main(["verify", str(ROOT / "examples/lab/cluster.yaml"), "--out", str(tmp_path)])
    captured = capsys.readouterr()
    printed = captured.out + captured.err
    assert rc == 1  # findings, one check not run
    assert "port state Down\\x1b]52;c;Y3VybCBldmlsIHwgc2g=\\x07 INJECTED line" in printed
    assert "nvidia-smi: \\x1b[2J\\x1b[1;1H\\x9b31mfailed" in printed
    assert not UNSAFE.search(printed), printed


def test_verify_json_escapes_what_json_dumps_leaves_raw(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """json.dumps(ensure_ascii=False) escapes C0 only: C1 CSI and bidi overrides went to the terminal with
    ``verify --json`` (failed on the old code); now they are \\u escapes and the JSON value is unchanged."""
    now = datetime.now(UTC)
    message = f"state {C1}Down\u202eevil\U000e0041 ↔ ok"
    finding = Finding("links", "error", "gpu01", "mlx5_0", 1, "Active", "Down", message, "check the cable")
    report = VerifyReport("lab", now, now, (CheckResult("links", "gpu01", False, (finding,)),))
    monkeypatch.setattr(provisioner.verify, "verify", lambda *a, **k: VerifyRun(report, tmp_path))
    rc = main(["verify", str(ROOT / "examples/lab/cluster.yaml"), "--out", str(tmp_path), "--json"])
    printed = capsys.readouterr().out
    assert rc == 1
    assert not UNSAFE.search(printed) and "\U000e0041" not in printed, printed
    assert "\\u009b" in printed and "\\u202e" in printed and "↔" in printed
    assert json.loads(printed)["findings"][0]["message"] == message


def test_progress_lines_show_node_text_escaped(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """verify's (and rolling's, replace-node's, failover's, discover's) progress lines quote what nodes said.
    Failed on the old code: the OSC 52 sequence was printed as it came."""
    now = datetime.now(UTC)
    report = VerifyReport("lab", now, now, (CheckResult("links", "gpu01", True),))

    def fake_verify(*_a: object, progress: Any = None, **_k: object) -> VerifyRun:
        progress(f"gpu01: ibstat: {OSC52}")
        return VerifyRun(report, tmp_path)

    monkeypatch.setattr(provisioner.verify, "verify", fake_verify)
    rc = main(["verify", str(ROOT / "examples/lab/cluster.yaml"), "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 0
    assert "[verify] gpu01: ibstat: \\x1b]52;c;Y3VybCBldmlsIHwgc2g=\\x07" in err, err
    assert not UNSAFE.search(err)


def test_a_rolling_batchs_reasons_carry_no_control_sequence() -> None:
    """The reasons a rolling batch failed go to its journal and the printed summary. Failed on the old code: the
    finding's message and the could-not-run reason kept their ESC bytes."""
    from provisioner.day2.peers import batch_failures

    now = datetime.now(UTC)
    finding = Finding("links", "error", "gpu01", "mlx5_0", 1, "Active", "Down", f"port Down{OSC52}", "cable")
    checks = (CheckResult("links", "gpu01", False, (finding,)),
              CheckResult("nccl", None, False, error=f"mpirun: {CSI}aborted"))
    why = batch_failures(VerifyReport("lab", now, now, checks), ["gpu01"])
    assert len(why) == 2 and not any(UNSAFE.search(w) for w in why), why
    assert "gpu01 mlx5_0/1: port Down\\x1b]52;c;Y3VybCBldmlsIHwgc2g=\\x07" in why
