"""One decision table for every host key: first trust (trust-host) and a replaced node (replace-node)."""

from __future__ import annotations

import pytest

from provisioner.hostkeys import decide

A = "SHA256:" + "A" * 43
B = "SHA256:" + "B" * 43


@pytest.mark.parametrize(("offered", "known", "expected", "replacing", "accept_new", "action"), [
    # already trusted: nothing to do, unless the operator's fingerprint contradicts it
    (A, [A], None, False, False, "known"),
    (A, [A], A, True, False, "known"),
    (A, [A], B, False, False, "refused"),
    (A, [A], B, True, True, "refused"),
    # a first key: only on the operator's matching fingerprint
    (A, [], A, False, False, "add"),
    (A, [], B, False, False, "refused"),
    (A, [], None, False, False, "refused"),
    # a different key where one is trusted: never trust-host's business
    (B, [A], B, False, False, "refused"),
    # a replaced node: the matching fingerprint, or --accept-new-host-key; never a contradicting fingerprint
    (B, [A], B, True, False, "replace"),
    (B, [A], None, True, True, "replace"),
    (B, [A], None, True, False, "refused"),
    (B, [A], A, True, True, "refused"),
])
def test_the_decision_table(offered: str, known: list[str], expected: str | None, replacing: bool, accept_new: bool,
                            action: str) -> None:
    verdict = decide("gpu01", offered, known, expected=expected, replacing=replacing, accept_new=accept_new)
    assert verdict.action == action, verdict
    assert verdict.offered == offered and verdict.known == tuple(known)
    if action == "refused":
        assert offered in verdict.reason and verdict.hint  # what is offered, and what to do next


def test_refusals_name_the_next_command() -> None:
    swapped = decide("gpu01", B, [A], expected=None)
    assert f"provision replace-node SPEC gpu01 --host-key-fingerprint {B}" in str(swapped.hint)
    first = decide("gpu01", A, [], expected=None)
    assert f"--fingerprint {A}" in str(first.hint) and "--accept-new-host-key" not in str(first.hint)
    replaced = decide("gpu01", B, [A], expected=None, replacing=True)
    assert f"--host-key-fingerprint {B}" in str(replaced.hint) and "--accept-new-host-key" in str(replaced.hint)
    mitm = decide("gpu01", B, [], expected=A)
    assert "in the middle" in str(mitm.hint)


def test_only_the_host_key_module_and_remote_import_paramiko() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "provisioner"
    importing = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                       if "\nimport paramiko" in p.read_text(encoding="utf-8"))
    assert importing == ["hostkeys.py", "remote.py"]
