"""``nccl_pkey_index``: the index NCCL_IB_PKEY needs, from the P_Key tables of the rail ports.

NCCL_IB_PKEY is the index in the port's P_Key table (NCCL net_ib.cc: ``qpAttr.pkey_index =
ncclParamIbPkey()``), not the key; the SM decides where a partition lands, so the index is read on the
node from ``/sys/class/infiniband/<dev>/ports/<port>/pkeys/<index>`` (``grep -r . <dir>`` output).
"""

from __future__ import annotations

from typing import Any


def _entries(stdout_lines: list[str]) -> dict[int, int]:
    table: dict[int, int] = {}
    for line in stdout_lines:
        path, sep, value = line.rpartition(":")
        name = path.rsplit("/", 1)[-1]
        if not sep or not name.isdigit():
            continue
        try:
            table[int(name)] = int(value.strip(), 16)
        except ValueError:
            continue
    return table


def nccl_pkey_index(results: list[dict[str, Any]], pkey: str) -> dict[str, Any]:
    """{"index": N or None, "missing": [ports without the key as full member], "indexes": {port: N}}.

    ``results`` are the registered loop results of ``grep -r . .../pkeys`` over the rail ports (``item`` has
    ``device`` and ``port``). The key matches on its low 15 bits with the full-member bit set; NCCL uses one
    index for every HCA, so ports that disagree leave ``index`` None.
    """
    want = int(str(pkey), 16) & 0x7FFF
    indexes: dict[str, int] = {}
    missing: list[str] = []
    for res in results:
        item = res.get("item") or {}
        port = f"{item.get('device')}:{item.get('port', 1)}"
        table = _entries(list(res.get("stdout_lines") or []))
        hits = sorted(i for i, key in table.items() if key & 0x7FFF == want and key & 0x8000)
        if hits:
            indexes[port] = hits[0]
        else:
            missing.append(port)
    values = set(indexes.values())
    index = values.pop() if len(values) == 1 and not missing else None
    return {"index": index, "missing": missing, "indexes": indexes}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"nccl_pkey_index": nccl_pkey_index}
