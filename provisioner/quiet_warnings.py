"""Third-party warnings an operator can do nothing about, kept out of the ansible runs' output.

ansible-core 2.19 imports cryptography's DSA classes for ssh-agent keys (``ansible/_internal/_ssh/_ssh_agent.py``),
and cryptography 51 warns on that import (``CryptographyDeprecationWarning: DSA is deprecated``). Every
ansible-playbook a run starts printed it, with the path of the Python environment, into the operator's output and
each phase's stdout artifact. The warning is about ansible's imports, not the cluster: nothing in a spec or on a node
can answer it.

Each entry names the warning's category and the exact module the warning is attributed to, so only that import
site is quieted; any other warning (and every error) still shows. The entries go to ansible's processes through
``PYTHONWARNINGS`` by their builtin base class (``UserWarning`` for ``CryptographyDeprecationWarning``): Python
resolves a dotted category there by importing its module in every interpreter the run starts (module processes on
the control node included), and prints "Invalid -W option ignored" wherever that import fails. An operator's own
``PYTHONWARNINGS`` comes after ours and so wins (``PYTHONWARNINGS=default`` shows everything again).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Quieted:
    category: str
    """The warning's class, as its package names it."""
    base: str
    """Its builtin base class: what PYTHONWARNINGS names (see the module's docstring)."""
    module: str
    """The module the warning is attributed to (Python matches it exactly)."""
    why: str


QUIETED = (
    Quieted("cryptography.utils.CryptographyDeprecationWarning", "UserWarning", "ansible._internal._ssh._ssh_agent",
            "cryptography 51 deprecates DSA; ansible-core 2.19 imports it for ssh-agent keys at every start"),
)


def pythonwarnings(environ: Mapping[str, str]) -> str:
    """``PYTHONWARNINGS`` for an ansible process: our filters first, then the caller's own (later ones win)."""
    ours = [f"ignore::{q.base}:{q.module}" for q in QUIETED]
    theirs = environ.get("PYTHONWARNINGS", "")
    return ",".join([*ours, theirs] if theirs else ours)
