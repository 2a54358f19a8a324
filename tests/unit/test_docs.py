"""The generated parts of docs/ (spec reference, GPU catalog, rules, compatibility table, CLI reference) match the
code, and the README stays a front door: short, and its setup starts with the two commands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from provisioner import docs
from provisioner.docs import DOCS, cli_reference, missing_sections, render_text, rules_reference, spec_reference
from provisioner.spec.catalog import GPU_MODELS
from provisioner.spec.rules import RULES

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


@pytest.mark.parametrize("rel", sorted(DOCS))
def test_generated_docs_carry_their_sections_and_are_current(rel: str) -> None:
    text = (ROOT / rel).read_text(encoding="utf-8")
    assert missing_sections(text, DOCS[rel]) == [], f"{rel}: a generated section lost its markers"
    assert render_text(text, DOCS[rel]) == text, "run: python -m provisioner.docs"


def test_a_stale_section_is_rewritten_and_check_mode_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    for rel in DOCS:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((ROOT / rel).read_text(encoding="utf-8"), encoding="utf-8")
    rules = tmp_path / "docs/rules.md"
    rules.write_text(rules.read_text(encoding="utf-8").replace("| `SM-MISSING` |", "| `SM-GONE` |"),
                     encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert docs.main(["--check"]) == 1
    assert "docs/rules.md" in capsys.readouterr().err
    assert "`SM-GONE`" in rules.read_text(encoding="utf-8")  # --check writes nothing
    assert docs.main([]) == 0
    assert "`SM-GONE`" not in rules.read_text(encoding="utf-8")
    assert docs.main(["--check"]) == 0


def test_reference_names_every_rule_key_model_and_command() -> None:
    ref = rules_reference()
    assert all(f"`{r.id}`" in ref for r in RULES)
    spec = spec_reference()
    for key in ("`min_fraction`", "`routing_engines`", "`pkey`", "`nconnect`", "`known_hosts`"):
        assert key in spec
    catalog = docs.gpu_catalog()
    assert all(f"`{k}`" in catalog for k in GPU_MODELS)
    cli = cli_reference()
    for command in ("provision validate", "provision verify", "provision replace-node", "provision trust-host",
                    "provision discover", "provision export slurm", "provision lab fault"):
        assert f"### `{command}`" in cli
        assert f"Usage: {command} " in cli


def test_rule_ids_are_unique() -> None:
    ids = [r.id for r in RULES]
    assert len(ids) == len(set(ids))


README_MAX_LINES = 200
SETUP_COMMANDS = ("./scripts/lab-demo", "./scripts/test")


def test_readme_is_a_front_door_of_at_most_200_lines() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move reference material to docs/"


def test_readme_setup_starts_with_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    setup = re.search(r"^## Set[ -]?up\b.*?$(.*?)(?=^## )", text, re.M | re.S | re.I)
    assert setup, "README.md has no '## Set up' section"
    block = re.search(r"```(?:sh|bash)?\n(.*?)```", setup.group(1), re.S)
    assert block, "the setup section has no command block"
    first = setup.group(1).lstrip().startswith("```")
    commands = [ln.split("#", 1)[0].strip() for ln in block.group(1).splitlines() if ln.strip()]
    assert first and commands == list(SETUP_COMMANDS), commands
    for cmd in SETUP_COMMANDS:  # and they are the scripts CI runs, executable from a fresh clone
        script = ROOT / cmd
        assert script.is_file() and script.stat().st_mode & 0o111, cmd
    assert "exec ./scripts/test" in (ROOT / ".ci/run").read_text(encoding="utf-8")


def test_readme_and_docs_link_only_to_files_that_exist() -> None:
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)  # code is not links
        text = re.sub(r"`[^`\n]*`", "", text)
        for target, anchor in re.findall(r"\]\(([^)#\s]+)(?:#([^)]*))?\)", text):
            if "://" in target:
                continue
            path = page.parent / target
            assert path.exists(), f"{page.relative_to(ROOT)} links to a missing {target}"
            if anchor:
                assert anchor in _anchors(path), f"{page.relative_to(ROOT)} links to a missing {target}#{anchor}"


def _anchors(page: Path) -> set[str]:
    """The heading anchors GitHub makes: lowercase, punctuation dropped (but - and _), spaces to hyphens."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def test_role_reference_lists_every_role_and_each_option_as_its_argument_spec_declares(tmp_path: Path) -> None:
    meta = tmp_path / "demo" / "meta"
    meta.mkdir(parents=True)
    (meta / "argument_specs.yml").write_text("""---
argument_specs:
  extra:
    short_description: The other entry point.
  main:
    short_description: Demo role.
    description:
      - First line.
    options:
      demo_mode:
        type: str
        default: fast
        choices: [fast, safe]
        description: How | to run.
      demo_hosts:
        type: list
        elements: str
        required: true
        description:
          - Hosts to touch,
          - one per line.
      demo_flag:
        type: bool
        default: false
""", encoding="utf-8")
    text = docs.role_reference(tmp_path)
    lines = text.splitlines()
    assert lines[0] == "### `demo`" and lines.index("Demo role.") < lines.index("`extra`: The other entry point.")
    # a pipe in a description stays inside its cell
    assert "| `demo_mode` | str | `fast` · one of `fast`, `safe` | How \\| to run. |" in lines
    assert "| `demo_hosts` | list of str | required | Hosts to touch, one per line. |" in lines
    assert "| `demo_flag` | bool | `false` |  |" in lines
    assert "No options." in lines  # the entry point without options says so

    real = docs.role_reference()
    roles = sorted(p.parent.parent.name for p in (ROOT / "roles").glob("*/meta/argument_specs.yml"))
    assert roles and [ln.removeprefix("### `").removesuffix("`") for ln in real.splitlines()
                      if ln.startswith("### ")] == roles
