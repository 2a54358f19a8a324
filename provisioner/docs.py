"""Generated documentation: the spec reference (from the pydantic models) and the rule list (from RULES).

`python -m provisioner.docs README.md` rewrites the generated sections of the README between their markers;
a test fails when the README is out of date, so the reference is never maintained by hand.
"""

from __future__ import annotations

import sys
import types
import typing
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


SECTIONS = {"spec-reference": spec_reference, "rules": rules_reference, "compat": compat_reference}


def render_readme(text: str) -> str:
    for name, fn in SECTIONS.items():
        start, end = f"<!-- BEGIN GENERATED {name} -->", f"<!-- END GENERATED {name} -->"
        if start not in text or end not in text:
            continue
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = f"{head}{start}\n{fn()}{end}{tail}"
    return text


def main(argv: list[str]) -> int:
    path = Path(argv[0] if argv else "README.md")
    old = path.read_text(encoding="utf-8")
    new = render_readme(old)
    if new != old:
        path.write_text(new, encoding="utf-8")
        print(f"{path}: generated sections updated")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
