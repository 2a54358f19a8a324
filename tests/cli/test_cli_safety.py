"""Issue #16 at the command line: hostile or broken input ends in one plain line and exit 1 or 2, never 3."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.cli import main

ROOT = Path(__file__).resolve().parents[2]
H100 = ROOT / "examples" / "h100-ndr-8node.yaml"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def one_error_line(out: str, err: str) -> str:
    lines = [ln for ln in (out + err).splitlines() if ln.strip()]
    assert "Traceback" not in out + err and "internal error" not in out + err, out + err
    return lines[0]


# --- item 8: diagnostics are plain text --------------------------------------------------------------------
def test_file_line_is_printed_as_plain_text(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """rich turned ':100:' into an emoji; a diagnostic on line 100 must read 'file:100:col:'."""
    lines = H100.read_text().splitlines()
    at = next(i for i, ln in enumerate(lines) if "priority: 15" in ln)
    padded = lines[:at] + ["# pad"] * (99 - at) + [lines[at].replace("priority: 15", "priority: 99")] + lines[at + 1:]
    spec = tmp_path / "c.yaml"
    spec.write_text("\n".join(padded) + "\n")
    rc, out, _ = run(capsys, "validate", str(spec))
    assert rc == 1
    assert f"{spec}:100:" in out, out
    assert "\N{HUNDRED POINTS SYMBOL}" not in out


def test_yaml_syntax_error_names_the_line_the_construct_starts(capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:
    """An unclosed '[' on line 22: the parser gives up at the end of the file; the error names line 22."""
    lines = H100.read_text().splitlines()[:21]
    lines += ["hosts_to_check: [gpu01,"] + [f"  gpu{i:02d}," for i in range(2, 20)]
    spec = tmp_path / "c.yaml"
    spec.write_text("\n".join(lines) + "\n")
    rc, out, _ = run(capsys, "validate", str(spec))
    assert rc == 1
    first = one_error_line(out, "")
    assert first.startswith(f"{spec}:22:"), first
    assert "YAML-SYNTAX" in first and "line 41" in first, first


# --- item 7: no exit 3 ----------------------------------------------------------------------------------------
def test_deep_nesting_is_a_spec_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    spec = tmp_path / "deep.yaml"
    spec.write_text("cluster: {name: x, os: debian-12}\nnodes: " + "[" * 20000 + "]" * 20000 + "\n")
    rc, out, err = run(capsys, "validate", str(spec))
    assert rc == 1, out + err
    first = one_error_line(out, err)
    assert first.startswith(f"{spec}:2:") and "YAML-DEPTH" in first, first


def test_huge_integer_is_a_spec_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    spec = tmp_path / "big.yaml"
    text = H100.read_text().replace("ports: 64, uplinks: 32", "ports: " + "9" * 5000 + ", uplinks: 32")
    spec.write_text(text)
    rc, out, err = run(capsys, "validate", str(spec))
    assert rc == 1, out + err
    first = one_error_line(out, err)
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if "9999" in ln)
    assert first.startswith(f"{spec}:{line}:") and "YAML-VALUE" in first, first[:200]
    assert len(first) < 400


def test_out_onto_a_file_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "afile"
    target.write_text("x\n")
    for cmd in ("render", "up"):
        rc, out, err = run(capsys, cmd, str(H100), "--out", str(target))
        assert rc == 2, (cmd, out, err)
        first = one_error_line(out, err)
        assert "--out" in first and "not a directory" in first, first
    assert target.read_text() == "x\n"


@pytest.mark.parametrize("cmd", [["plan", "--cached"], ["failover", "gpu01"], ["watch", "--once"], ["verify"],
                                 ["drift"], ["status"], ["tune"], ["replace-node", "gpu01"], ["trust-host", "gpu01"]],
                         ids=lambda c: c[0])
def test_every_state_dir_out_onto_a_file_is_the_same_usage_error(capsys: pytest.CaptureFixture[str],
                                                                 tmp_path: Path, cmd: list[str]) -> None:
    """--out is one option wherever it names the state directory: plan planned from no cached manifests at all
    ('run provision plan without --cached') and failover and watch said only 'afile: File exists'."""
    target = tmp_path / "afile"
    target.write_text("x\n")
    rc, out, err = run(capsys, cmd[0], str(H100), *cmd[1:], "--out", str(target))
    assert rc == 2, (out, err)
    first = one_error_line(out, err)
    assert "Invalid value for '--out'" in first and "afile: not a directory" in first, first
    assert target.read_text() == "x\n"


@pytest.mark.parametrize("doc", ['{"hosts": []}', "[]", '{"run_id": "x", "cluster": "c", "spec": "s", '
                                 '"phases_planned": 5, "hosts": {}}', '{"run_id": "x", "cluster": "c", '
                                 '"spec": "s", "phases_planned": [], "hosts": {"a": {"completed": 3}}}'],
                         ids=["hosts-list", "list", "phases-number", "completed-number"])
def test_malformed_journal_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path, doc: str) -> None:
    run_dir = tmp_path / "runs" / "20250101T000000.000000Z-abcdef"
    run_dir.mkdir(parents=True)
    (run_dir / "journal.json").write_text(doc)
    rc, out, err = run(capsys, "status", str(H100), "--out", str(tmp_path))
    assert rc == 2, out + err
    assert "journal" in one_error_line(out, err)
    rc, out, err = run(capsys, "up", str(H100), "--out", str(tmp_path), "--resume", "--json")
    assert rc == 2, out + err
    assert "journal" in one_error_line(out, err)


def test_a_spec_name_with_control_characters_stays_one_line(capsys: pytest.CaptureFixture[str],
                                                           tmp_path: Path) -> None:
    """Issue #26: the file name leads every diagnostic; a newline or an escape sequence in it was printed raw (a
    second line, terminal control), now escaped like the message."""
    spec = tmp_path / "c\n\x1b[2Jx.yaml"
    spec.write_text(H100.read_text().replace("priority: 15", "priority: 99", 1))
    rc, out, err = run(capsys, "validate", str(spec))
    assert rc == 1, out + err
    first = one_error_line(out, err)
    assert first.startswith(f"{tmp_path}/c\\n\\x1b[2Jx.yaml:"), first
    assert "\x1b" not in out + err


def test_an_error_naming_a_path_with_control_characters_is_one_line(capsys: pytest.CaptureFixture[str],
                                                                   tmp_path: Path) -> None:
    """Issue #26: an error message carries the path as given (here a spec that does not exist); its newline and
    escape sequence were printed raw."""
    rc, out, err = run(capsys, "render", str(tmp_path / "nope\n\x1b[2Jx.yaml"))
    assert rc == 2, out + err
    assert len((out + err).strip().splitlines()) == 1 and "\x1b" not in out + err, out + err
    assert "nope\\n\\x1b[2Jx.yaml: no such file" in err, err
