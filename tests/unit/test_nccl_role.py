"""The nccl role's P_Key lookup: NCCL_IB_PKEY is an index in the port's table (NCCL net_ib.cc), found on the node."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("nccl_pkey", ROOT / "roles" / "nccl" / "filter_plugins" / "nccl_pkey.py")
assert _spec and _spec.loader
nccl_pkey = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nccl_pkey)


def table(dev: str, *keys: str) -> dict[str, Any]:
    """What ``grep -r . /sys/class/infiniband/<dev>/ports/1/pkeys`` prints (grep's order is the directory's)."""
    lines = [f"/sys/class/infiniband/{dev}/ports/1/pkeys/{i}:{k}" for i, k in enumerate(keys)]
    return {"item": {"device": dev, "port": 1}, "stdout_lines": list(reversed(lines))}


def test_pkey_index_is_found_per_port_and_must_agree() -> None:
    both = [table("mlx5_0", "0xffff", "0x8001", "0x0000"), table("mlx5_1", "0xffff", "0x8001")]
    assert nccl_pkey.nccl_pkey_index(both, "0x8001") == {"index": 1, "missing": [],
                                                          "indexes": {"mlx5_0:1": 1, "mlx5_1:1": 1}}
    assert nccl_pkey.nccl_pkey_index(both, "0x0001")["index"] == 1  # the key is matched on its low 15 bits
    limited = [table("mlx5_0", "0xffff", "0x0001")]  # a limited member cannot be NCCL's partition
    assert nccl_pkey.nccl_pkey_index(limited, "0x8001") == {"index": None, "missing": ["mlx5_0:1"], "indexes": {}}
    split = [table("mlx5_0", "0xffff", "0x8001"), table("mlx5_1", "0xffff", "0x8002", "0x8001")]
    found = nccl_pkey.nccl_pkey_index(split, "0x8001")
    assert found["index"] is None and found["indexes"] == {"mlx5_0:1": 1, "mlx5_1:1": 2}
    assert nccl_pkey.nccl_pkey_index([table("mlx5_0", "0xffff")], "0x8001")["missing"] == ["mlx5_0:1"]
