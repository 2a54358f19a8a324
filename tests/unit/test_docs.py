"""The README's generated sections (spec reference, rule list) match the code."""

from __future__ import annotations

from pathlib import Path

from provisioner.docs import render_readme, rules_reference, spec_reference
from provisioner.spec.rules import RULES

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_generated_sections_are_current() -> None:
    text = README.read_text(encoding="utf-8")
    assert render_readme(text) == text, "run: python -m provisioner.docs README.md"


def test_reference_names_every_rule_and_key() -> None:
    ref = rules_reference()
    assert all(f"`{r.id}`" in ref for r in RULES)
    spec = spec_reference()
    for key in ("`min_fraction`", "`routing_engines`", "`pkey`", "`nconnect`", "`known_hosts`"):
        assert key in spec


def test_rule_ids_are_unique() -> None:
    ids = [r.id for r in RULES]
    assert len(ids) == len(set(ids))
