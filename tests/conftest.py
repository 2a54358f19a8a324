"""Shared test setup: the venv's tools (ansible-inventory, ansible-playbook) on PATH, repository paths."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

# ansible_runner and molecule start ansible-* by name: make the interpreter's own bin dir win.
_bin = str(Path(sys.executable).parent)
if _bin not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = _bin + os.pathsep + os.environ.get("PATH", "")


@pytest.fixture
def examples_dir() -> Path:
    return EXAMPLES
