"""Render a role's Jinja expression with its defaults and vars, as ansible-core's Templar does in a play."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

ROLES = Path(__file__).resolve().parents[2] / "roles"


def _trusted(value: Any) -> Any:
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {k: _trusted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_trusted(v) for v in value]
    return value


def render_role(role: str, expr: str, *, vars_files: tuple[str, ...] = ("main.yml",),
                task_vars: dict[str, Any] | None = None, **given: Any) -> Any:
    """`expr` rendered with `role`'s defaults, then its vars/`vars_files` in order, then a task's `task_vars`
    (templates, as the role's own are), then `given` (data, as is)."""
    variables: dict[str, Any] = {}
    for path in [ROLES / role / "defaults" / "main.yml"] + [ROLES / role / "vars" / f for f in vars_files]:
        if path.is_file():
            variables.update(_trusted(yaml.safe_load(path.read_text(encoding="utf-8")) or {}))
    variables.update(_trusted(task_vars or {}))
    variables.update(given)
    return Templar(loader=DataLoader(), variables=variables).template(trust_as_template(expr))
