"""Lab test order: the longest modules first.

scripts/test runs the lab modules on two pytest-xdist workers, a module at a time per worker (``--dist loadfile
--no-loadscope-reorder``: a worker takes the next module in collection order when its current one is nearly
done). Started last, the end-to-end and Slurm modules (about 10 and 5 of the lab phase's 28 serial minutes) would
leave one worker running alone at the end; started first, the short modules fill in beside them. Per-module times:
docs/benchmarks.md ("Lab tests").
"""

from __future__ import annotations

import pytest

LONGEST_FIRST = (
    "test_e2e_lab.py",
    "test_slurm_lab.py",
    "test_verify_faults.py",
    "test_discover_lab.py",
    "test_lab_stack.py",
    "test_storage_lab.py",
    "test_sm_lab.py",
    "test_lab_faults_file.py",
    "test_run_lab.py",
)
"""Lab modules in the order they start; the others follow in their collection order."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Stable sort: a listed lab module's tests go first, in the list's order; every other test keeps its order."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)) if item.path.parent.name == "lab" else len(rank))
