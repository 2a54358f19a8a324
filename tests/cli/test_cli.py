"""The `provision` command line: exit codes, one-line errors, JSON output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from provisioner import phases
from provisioner.cli import main
from provisioner.runner import FakeRun, PlaybookResult, fake_result

ROOT = Path(__file__).resolve().parents[2]
H100 = str(ROOT / "examples" / "h100-ndr-8node.yaml")
TWO_HCA = str(ROOT / "examples" / "h100-ndr-8node-2hca.yaml")


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "--version")
    assert rc == 0 and out.startswith("provision 0.")


def test_validate_clean_and_warning_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "validate", H100)[0] == 0
    rc, _, err = run(capsys, "validate", TWO_HCA)
    assert rc == 0 and "RAIL-PER-GPU" in err
    assert run(capsys, "validate", "--strict", TWO_HCA)[0] == 1


def test_validate_errors_print_one_line_each(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(Path(H100).read_text().replace('cuda: "12.4.1"', "cuda: 12.4").replace("priority: 14",
                                                                                         "priority: 15"))
    rc, out, _ = run(capsys, "validate", str(bad))
    assert rc == 1
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{bad}:8:9: SPEC-SCHEMA:")
    rc, out, _ = run(capsys, "validate", "--json", str(bad))
    data = json.loads(out)
    assert rc == 1 and data["ok"] is False and data["diagnostics"][0]["line"] == 8


def test_bad_files_are_one_line_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, _, err = run(capsys, "validate", str(tmp_path / "missing.yaml"))
    assert rc == 2 and err.count("\n") == 1 and "no such file" in err
    binary = tmp_path / "b.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    rc, _, err = run(capsys, "validate", str(binary))
    assert rc == 2 and "not UTF-8" in err and "Traceback" not in err


def test_default_command_is_the_bring_up(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """`provision cluster.yaml` validates, renders and converges every phase's playbook on every node. The
    example's nodes are not this project's lab, so no SSH may reach them: the playbooks go to a recorder."""
    played: list[tuple[str, list[str]]] = []

    def runner(playbook: Path, inventory_dir: Path, *, limit: list[str], **kw: object) -> PlaybookResult:
        assert (inventory_dir / "hosts.yml").is_file()
        played.append((playbook.name, sorted(limit)))
        return fake_result(playbook.name, list(limit), FakeRun())

    real = phases.provision_run
    monkeypatch.setattr(phases, "provision_run", lambda spec, opts, **kw: real(spec, opts, runner=runner, **kw))
    rc, _, err = run(capsys, H100, "--out", str(tmp_path), "--only", "preflight,repos,ofed,gpu_stack,fabric")
    assert (tmp_path / "inventory" / "hosts.yml").is_file()
    assert "validate: ok" in err
    every = sorted([f"gpu{i:02d}" for i in range(1, 9)] + ["sm1", "sm2"])
    assert [name for name, _ in played] == ["preflight.yml", "repos.yml", "ofed.yml", "gpu_stack.yml",
                                            "fabric.yml"], err
    assert all(hosts == every for _, hosts in played), played
    assert rc == 0, err


def test_render_diff(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, out, err = run(capsys, "render", H100, "--out", str(tmp_path), "--diff")
    assert rc == 0 and "+++ b/hosts.yml" in out
    rc, out, err = run(capsys, "render", H100, "--out", str(tmp_path), "--diff")
    assert rc == 0 and out == "" and "unchanged" in err


def test_parse_command(capsys: pytest.CaptureFixture[str]) -> None:
    fixture = sorted((ROOT / "tests" / "fixtures" / "lsmod").iterdir())[0]
    body = "\n".join(ln for ln in fixture.read_text().splitlines() if not ln.startswith("# Source")
                     and not ln.startswith("# Shows"))
    tmp = fixture.parent.parent.parent / ".tmp-lsmod.txt"
    try:
        tmp.write_text(body)
        rc, out, _ = run(capsys, "parse", "lsmod", str(tmp))
    finally:
        tmp.unlink()
    assert rc == 0 and json.loads(out)["tool"] == "lsmod"
    rc, _, err = run(capsys, "parse", "ibstat", str(ROOT / "README.md"))
    assert rc == 2 and err.count("\n") == 1
    rc, _, err = run(capsys, "parse", "nosuchtool", "-")
    assert rc == 2 and "unknown tool" in err


def test_usage_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "validate", "--nope", H100)
    assert rc == 2 and "No such option" in err and "Traceback" not in err
    assert run(capsys, "rules")[0] == 0


def test_rules_lists_ids(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "rules")
    assert rc == 0
    assert "SM-PRIORITY-TIE [error]" in out and "FAT-TREE-OVERSUB [warning]" in out


def test_verify_names_nodes_it_cannot_reach_once(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """No known_hosts file: no node is contacted (nothing to verify host keys against); each could-not-run cause
    is one line naming the nodes as a hostlist, no check blames a port, and the exit code is 2 (could not run)."""
    spec = tmp_path / "cluster.yaml"
    spec.write_text(Path(H100).read_text())  # ssh.known_hosts: known_hosts, next to the spec: absent
    rc, out, _ = run(capsys, "verify", str(spec), "--only", "links,bandwidth", "--out", str(tmp_path / "state"))
    lines = out.strip().splitlines()
    assert rc == 2, out
    assert lines[0] == (f"NOT RUN ssh gpu[01-08],sm[1-2]: known_hosts file {tmp_path / 'known_hosts'} does not exist "
                        "(create it with the nodes' verified keys (ssh.known_hosts in the spec names it))"), lines
    assert lines[1].startswith("INCOMPLETE: ") and len(lines) == 2, lines


def test_missing_playbook_is_one_line_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """An install without a phase's playbook: exit 2 and one line naming the file and the fix, before any phase."""
    import shutil

    from provisioner import collection as content

    real = content.collection()
    root = tmp_path / "site" / "ansible_collections" / "provisioner" / "cluster"
    shutil.copytree(real.playbooks_dir, root / "playbooks")
    (root / "roles").mkdir()
    (root / "playbooks" / "ofed.yml").unlink()
    monkeypatch.setattr(content, "collection", lambda: content.Collection(root, checkout=False))
    rc, _, err = run(capsys, H100, "--out", str(tmp_path / "state"))
    assert rc == 2, err
    assert err == (f"provision: error: phase ofed: playbook {root / 'playbooks' / 'ofed.yml'} is missing (the "
                   "installed provisioner package is incomplete: reinstall it, e.g. pipx reinstall provisioner)\n")
    assert not (tmp_path / "state" / "inventory").exists()  # not even rendered: nothing ran


def test_missing_playbook_hint_in_a_checkout() -> None:
    from provisioner.collection import collection

    coll = collection()
    assert coll.checkout and coll.playbooks_dir == ROOT / "playbooks" and coll.roles_dir == ROOT / "roles"
    assert coll.fix_hint(coll.playbooks_dir / "ofed.yml") == ("restore it in the source checkout: "
                                                              "git checkout -- playbooks/ofed.yml")


def test_collection_path(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "collection-path")
    galaxy = Path(out.strip()) / "ansible_collections" / "provisioner" / "cluster" / "galaxy.yml"
    assert rc == 0 and out.count("\n") == 1 and "name: cluster" in galaxy.read_text()


def test_the_words_taken_as_commands_are_the_commands_typer_registered() -> None:
    """`provision FILE` means `provision up FILE` unless FILE is a command: the set of command words is read from
    the app (it was a hand-kept set beside it, which a new command had to remember)."""
    import typer.main

    from provisioner.cli import app, command_names

    assert command_names() == set(typer.main.get_command(app).commands)
    assert {"collection-path", "replace-node", "validate", "lab", "export"} <= command_names()
