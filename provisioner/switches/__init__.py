"""Fabric switches: what to push (plan), with which login (credentials), and pushing it (session).

`plan` and `credentials` are importable without a network; only `session` imports netmiko, and it is the one
place in the package that does.
"""

from __future__ import annotations

from provisioner.switches.plan import Block, Check, SwitchPlan, display, plan_cluster

__all__ = ["Block", "Check", "SwitchPlan", "display", "plan_cluster"]
