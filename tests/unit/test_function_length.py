"""No function in provisioner/ outside the lab is longer than 80 lines (issue #28).

A long function hides several concepts behind one name; this walks the syntax tree of every module and names each
offender with its length, so the split is measured, not remembered."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "provisioner"
LIMIT = 80


def _modules() -> list[Path]:
    """Every module of the package but the lab's (and the collection, which is links to the Ansible side)."""
    return sorted(p for p in PACKAGE.rglob("*.py")
                  if p.relative_to(PACKAGE).parts[0] not in ("lab", "ansible_collections"))


def _long_functions(source: str, limit: int) -> list[tuple[str, int]]:
    """(name, lines) of each function, nested ones and methods included, longer than limit lines."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            length = (node.end_lineno or node.lineno) - first + 1
            if length > limit:
                found.append((node.name, length))
    return found


def test_the_walk_measures_a_function_from_its_decorator_to_its_last_line() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    method = "\n".join(f"    {line}" for line in body.splitlines())
    source = f"@decorator\ndef long():\n{body}\n\ndef short():\n    return 1\n\nclass C:\n    def m(self):\n{method}\n"
    assert _long_functions(source, LIMIT) == [("long", 82), ("m", 81)]


def test_the_walk_sees_the_package() -> None:
    names = {p.relative_to(PACKAGE).as_posix() for p in _modules()}
    assert {"cli.py", "spec/load.py", "render/model.py"} <= names
    assert not any(n.startswith(("lab/", "ansible_collections/")) for n in names)


def test_no_function_is_longer_than_80_lines() -> None:
    offenders = [f"{path.relative_to(PACKAGE)}: {name} has {length} lines"
                 for path in _modules() for name, length in _long_functions(path.read_text(encoding="utf-8"), LIMIT)]
    assert not offenders, "split these into helpers (one concept each):\n" + "\n".join(offenders)
