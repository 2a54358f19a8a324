"""Generated documentation: the reference parts of `docs/` are written from the code, never by hand.

Each generated part sits between `<!-- BEGIN GENERATED name -->` and `<!-- END GENERATED name -->` in one of the
files of :data:`DOCS`: the spec reference and the GPU catalog (from the pydantic models and the catalog), the
design rules and the version compatibility table (from RULES and the compat facts), the CLI reference (each
command's `--help`, as `provision` prints it) and the role reference (each role's ``meta/argument_specs.yml``, the
contract ansible-core checks every role's variables against before the role runs).

    python -m provisioner.docs            rewrite the generated parts of every file in DOCS (from the repo root)
    python -m provisioner.docs --check    write nothing; exit 1 naming each file that is out of date

`tests/unit/test_docs.py` fails when a file is out of date, so the reference never drifts from the code.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from provisioner.spec.models import Spec


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        parts = [_type_name(a) for a in args if a is not type(None)]
        return " \\| ".join(parts) + (" (optional)" if type(None) in args else "")
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return f"map of {_type_name(args[0])} → {_type_name(args[1])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{annotation.__name__.lower()})"
    return getattr(annotation, "__name__", str(annotation))


def _models(root: type[BaseModel]) -> list[type[BaseModel]]:
    seen: list[type[BaseModel]] = []

    def walk(model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.append(model)
        for f in model.model_fields.values():
            stack = [f.annotation]
            while stack:
                a = stack.pop()
                if isinstance(a, type) and issubclass(a, BaseModel):
                    walk(a)
                stack.extend(typing.get_args(a))

    walk(root)
    return seen


def _default(field: Any) -> str:
    if field.is_required():
        return "**required**"
    if field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:
            return ""
        if isinstance(value, BaseModel):
            return "(defaults)"
        return f"`{value}`" if value not in ([], {}) else ""
    if field.default is PydanticUndefined or field.default is None:
        return ""
    return f"`{str(field.default).lower() if isinstance(field.default, bool) else field.default}`"


def spec_reference() -> str:
    lines: list[str] = []
    for model in _models(Spec):
        lines.append(f"#### {model.__name__}")
        lines.append("")
        lines.append("| key | type | default | meaning |")
        lines.append("|---|---|---|---|")
        for name, f in model.model_fields.items():
            desc = (f.description or "").replace("|", "\\|")
            lines.append(f"| `{name}` | {_type_name(f.annotation)} | {_default(f)} | {desc} |")
        lines.append("")
    return "\n".join(lines)


def rules_reference() -> str:
    from provisioner.spec.rules import RULES

    lines = ["| rule | severity | why |", "|---|---|---|"]
    for r in RULES:
        lines.append(f"| `{r.id}` | {r.severity} | {r.why} |")
    return "\n".join(lines) + "\n"


def compat_reference() -> str:
    from provisioner.spec.compat import compat_table

    lines = ["| component | version | requires |", "|---|---|---|"]
    lines += [f"| {comp} | {ver} | {req} |" for comp, ver, req in compat_table()]
    return "\n".join(lines) + "\n"


def gpu_catalog() -> str:
    from provisioner.spec.catalog import GPU_MODELS

    lines = ["| `gpu.model` | nvidia-smi name | memory (MiB) | form | NVLink per GPU (GB/s, one way) | PCIe gen "
             "| architecture |", "|---|---|---:|---|---:|---:|---|"]
    for g in GPU_MODELS.values():
        lines.append(f"| `{g.key}` | {g.smi_name} | {g.memory_mib} | {g.form} | {g.nvlink_gbps:g} | {g.pcie_gen} "
                     f"| {g.arch} |")
    return "\n".join(lines) + "\n"


HELP_COLUMNS = "100"
"""The terminal width the help text is rendered for (click caps it at 80 columns; a fixed value keeps the
reference the same whatever terminal generates it)."""


@contextlib.contextmanager
def _columns(value: str) -> Iterator[None]:
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def _root_command() -> Any:
    """The click command typer builds for `provision` (built once: each build walks every command)."""
    import typer

    from provisioner.cli import app

    return typer.main.get_command(app)


def _help_text(root: Any, args: Sequence[str]) -> str:
    """What `provision ARGS --help` prints."""
    buf = io.StringIO()
    with _columns(HELP_COLUMNS), contextlib.redirect_stdout(buf):
        root.main(args=[*args, "--help"], prog_name="provision", standalone_mode=False)
    return buf.getvalue().rstrip() + "\n"


def _command_paths(root: Any) -> list[list[str]]:
    """Every command of `provision`, in the order its help lists them (sub-commands of a group after it)."""
    paths: list[list[str]] = []

    def walk(group: Any, prefix: list[str]) -> None:
        ctx = group.context_class(group, info_name=" ".join(["provision", *prefix]))
        for name in group.list_commands(ctx):
            cmd = group.get_command(ctx, name)
            if cmd is None or getattr(cmd, "hidden", False):
                continue
            paths.append([*prefix, name])
            if hasattr(cmd, "list_commands"):
                walk(cmd, [*prefix, name])

    walk(root, [])
    return paths


def cli_reference() -> str:
    """One section per command: its `--help` as printed (the root's completion options left out: they depend on
    the shell typer detects)."""
    root = _root_command()
    lines: list[str] = []
    for path in _command_paths(root):
        name = " ".join(["provision", *path])
        lines += [f"### `{name}`", "", "```text", _help_text(root, path).rstrip(), "```", ""]
    return "\n".join(lines)


def _cell(text: object) -> str:
    """One markdown table cell: a newline or a pipe in the text would break the row."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _yaml_value(value: object) -> str:
    """A default as the role's YAML would write it (``true``, ``''``, ``[]``, ``{a: 1}``), on one line."""
    if isinstance(value, str):
        return _cell(value) if value else "''"
    return _cell(json.dumps(value)).replace('"', "") if value is not None else "null"


def _option_rows(options: dict[str, Any]) -> list[str]:
    rows = ["| option | type | required / default | description |", "|---|---|---|---|"]
    for name in sorted(options):
        opt = options[name] or {}
        kind = str(opt.get("type", "str"))
        if kind == "list" and opt.get("elements"):
            kind = f"list of {opt['elements']}"
        if opt.get("required"):
            need = "required"
        elif "default" in opt:
            need = f"`{_yaml_value(opt['default'])}`"
        else:
            need = ""
        if opt.get("choices"):
            need += (" · " if need else "") + "one of " + ", ".join(f"`{_cell(c)}`" for c in opt["choices"])
        desc = opt.get("description", "")
        desc = " ".join(desc) if isinstance(desc, list) else desc
        rows.append(f"| `{name}` | {kind} | {need} | {_cell(desc)} |")
    return rows


def role_reference(roles: Path | None = None) -> str:
    """One section per role of the collection: each entry point's short description, its description and its
    options (type, required or default, choices, description), as the role's ``meta/argument_specs.yml`` declares
    them: the same file ansible-core validates a role's variables against, so the page cannot promise an option the
    role would refuse."""
    import yaml  # here: only the docs build reads role metadata

    from provisioner.collection import roles_dir

    root = roles if roles is not None else roles_dir()
    lines: list[str] = []
    for spec_file in sorted(root.glob("*/meta/argument_specs.yml")):
        role = spec_file.parent.parent.name
        entries = (yaml.safe_load(spec_file.read_text(encoding="utf-8")) or {}).get("argument_specs") or {}
        lines += [f"### `{role}`", ""]
        for entry in sorted(entries, key=lambda e: (e != "main", e)):
            spec = entries[entry] or {}
            title = f"`{entry}`: " if entry != "main" else ""
            lines += [f"{title}{_cell(spec.get('short_description', ''))}", ""]
            desc = spec.get("description") or []
            lines += [f"- {_cell(d)}" for d in (desc if isinstance(desc, list) else [desc])]
            lines += [""] if desc else []
            options = spec.get("options") or {}
            lines += [*_option_rows(options), ""] if options else ["No options.", ""]
    return "\n".join(lines)


SECTIONS: dict[str, Callable[[], str]] = {
    "spec-reference": spec_reference,
    "gpu-catalog": gpu_catalog,
    "rules": rules_reference,
    "compat": compat_reference,
    "cli": cli_reference,
    "roles": role_reference,
}

DOCS: dict[str, tuple[str, ...]] = {
    "docs/spec-reference.md": ("gpu-catalog", "spec-reference"),
    "docs/rules.md": ("rules", "compat"),
    "docs/cli.md": ("cli",),
    "docs/role-reference.md": ("roles",),
}
"""Each generated file (relative to the repository root) and the sections it must carry."""


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- BEGIN GENERATED {name} -->", f"<!-- END GENERATED {name} -->"


def missing_sections(text: str, names: Sequence[str]) -> list[str]:
    """The sections of ``names`` whose BEGIN/END markers are not both in ``text``."""
    return [n for n in names if any(m not in text for m in _markers(n))]


def render_text(text: str, names: Sequence[str] | None = None) -> str:
    """``text`` with every generated section of ``names`` (default: all) rewritten between its markers."""
    cache: dict[str, str] = {}
    for name in names if names is not None else list(SECTIONS):
        start, end = _markers(name)
        if start not in text or end not in text:
            continue
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        if name not in cache:
            cache[name] = SECTIONS[name]()
        text = f"{head}{start}\n{cache[name]}{end}{tail}"
    return text


def main(argv: list[str]) -> int:
    check = "--check" in argv
    unknown = [a for a in argv if a != "--check"]
    if unknown:
        print(f"provisioner.docs: unknown argument(s) {' '.join(unknown)}; usage: python -m provisioner.docs "
              "[--check]", file=sys.stderr)
        return 2
    stale: list[str] = []
    for rel, names in DOCS.items():
        path = Path(rel)
        try:
            old = path.read_text(encoding="utf-8")
        except OSError as exc:
            print(f"provisioner.docs: {rel}: {exc.strerror or exc} (run from the repository root)", file=sys.stderr)
            return 2
        missing = missing_sections(old, names)
        if missing:
            print(f"provisioner.docs: {rel}: no markers for {', '.join(missing)}", file=sys.stderr)
            return 2
        new = render_text(old, names)
        if new == old:
            continue
        stale.append(rel)
        if not check:
            path.write_text(new, encoding="utf-8")
            print(f"{rel}: generated sections updated")
    if check and stale:
        print("out of date (run: python -m provisioner.docs): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
