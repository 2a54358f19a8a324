"""Parser for nccl-tests (``all_reduce_perf`` and friends): text tables and the ``-J`` JSON file.

The table is read through its header row, not by fixed positions: the column set changed
over the years (``error`` became ``#wrong``, ``root`` was added, per-iteration and timestamp
columns are optional) and pasted logs often lose the leading ``#``. The first ``time`` group
is out-of-place, the second in-place. ``Avg bus bandwidth`` averages every size, small ones
included, so ``largest`` (the out-of-place bus bandwidth at the largest size) is what a
fabric check should judge.
"""

from __future__ import annotations

import json
import re
from typing import Any

from provisioner.errors import ParseError
from provisioner.parsers._common import require_text, to_float, to_int

_RANK_RE = re.compile(r"^#?\s*Rank\s+\d+\s+(?:Group\s+\d+\s+)?(?:Pid\s+\d+\s+)?on\s+\S+\s+device\s+\d+")
_OP_RE = re.compile(r"Collective test starting:\s*(\S+)")
_OOB_RE = re.compile(r"Out of bounds values\s*:\s*(\d+)\s*(OK|FAILED)?")
_AVG_RE = re.compile(r"Avg bus bandwidth\s*:\s*([0-9.eE+\-]+|nan)\s*(OK|FAILED)?")
_FAIL_RE = re.compile(r"(?:Test (?:NCCL |CUDA )?failure|NCCL failure|CUDA failure|^#?\s*error:\s*\S)")
#: ``mpirun --tag-output`` prefixes every line with ``[job,rank]<stdout>:``.
_TAG_RE = re.compile(r"^\s*\[\d+,\d+\]<(?:stdout|stderr)>:")
#: Lines that only nccl-tests prints: its own failure reports (``Test NCCL failure common.cu:1005 ...``,
#: nccl-tests 1.x ``NCCL failure all_reduce.cu:95 ...``) and its parameter line (``nThread 1 nGpus 8 ...``,
#: rccl-tests ``nThreads: 1 nGpus: 4 ...``). They make a text nccl-tests output even without a table.
_OWN_RE = re.compile(
    r"(?:Test (?:NCCL |CUDA )?failure|NCCL failure|CUDA failure) \S+\.cu:\d+|^#?\s*nThreads?:?\s+\d+\s+nGpus:?\s+\d+"
)
_ROW_TYPES = re.compile(r"^(?:u?int(?:8|32|64)|half|float|double|bfloat16|f8e4m3|f8e5m2|fp8_e4m3|fp8_e5m2)$")


def _op_name(program: str) -> str:
    """``/opt/nccl-tests/build/all_reduce_perf`` -> ``all_reduce``."""
    base = program.rsplit("/", 1)[-1]
    return base[: -len("_perf")] if base.endswith("_perf") else base


def _header_columns(line: str) -> list[str] | None:
    toks = line.strip().lstrip("#").split()
    if len(toks) >= 6 and (toks[:3] == ["size", "count", "type"] or toks[:3] == ["bytes", "N", "type"]):
        return toks
    return None


def _summarise(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    usable = [r for r in rows if r["oop_busbw_gbs"] is not None]
    if not usable:
        return None
    big = max(usable, key=lambda r: r["size_bytes"])
    return {"size_bytes": big["size_bytes"], "busbw_gbs": big["oop_busbw_gbs"]}


def _row_from_cells(cols: list[str], cells: list[str]) -> dict[str, Any] | None:
    if len(cells) < 4 or to_int(cells[0]) is None or to_int(cells[1]) is None:
        return None
    if not _ROW_TYPES.match(cells[2]):
        return None
    times = [i for i, c in enumerate(cols) if c in ("time", "cputime")]
    if len(times) < 2 or len(cells) < times[1] + 3:
        return None

    def group(start: int) -> tuple[float | None, float | None, int | None]:
        algbw = to_float(cells[start + 1])
        busbw = to_float(cells[start + 2])
        wrong_col = cols[start + 3] if start + 3 < len(cols) and start + 3 < len(cells) else ""
        wrong = to_int(cells[start + 3]) if wrong_col == "#wrong" else None
        if wrong is None and wrong_col == "#wrong":
            f = to_float(cells[start + 3])
            wrong = int(f) if f is not None else None
        return algbw, busbw, wrong

    oa, ob, ow = group(times[0])
    ia, ib, iw = group(times[1])
    wrongs = [w for w in (ow, iw) if w is not None]
    return {
        "size_bytes": int(cells[0]),
        "count": int(cells[1]),
        "type": cells[2],
        "oop_algbw_gbs": oa,
        "oop_busbw_gbs": ob,
        "ip_algbw_gbs": ia,
        "ip_busbw_gbs": ib,
        "wrong": sum(wrongs) if wrongs else None,
    }


def _parse_text(text: str) -> dict[str, Any]:
    op: str | None = None
    ranks = 0
    cols: list[str] | None = None
    rows: list[dict[str, Any]] = []
    oob: int | None = None
    oob_failed = False
    avg: float | None = None
    avg_failed = False
    errors: list[str] = []
    own = False
    for raw in text.splitlines():
        line = _TAG_RE.sub("", raw, count=1)
        own = own or bool(_OWN_RE.search(line))
        if _RANK_RE.match(line.strip()):
            ranks += 1
            continue
        m = _OP_RE.search(line)
        if m:
            op = _op_name(m.group(1))
            continue
        hdr = _header_columns(line)
        if hdr:
            cols = hdr
            continue
        m = _OOB_RE.search(line)
        if m:
            oob, oob_failed = int(m.group(1)), m.group(2) == "FAILED"
            continue
        m = _AVG_RE.search(line)
        if m:
            avg, avg_failed = to_float(m.group(1)), m.group(2) == "FAILED"
            continue
        if _FAIL_RE.search(line.strip()):
            errors.append(line.strip())
            continue
        if cols and not line.lstrip().startswith("#"):
            row = _row_from_cells(cols, line.split())
            if row:
                rows.append(row)
    if cols is None and not rows and not own:
        raise ParseError("nccl-tests: no 'size count type ...' result header or nccl-tests line; not nccl-tests output")
    warnings: list[str] = []
    if avg is None:
        warnings.append("no 'Avg bus bandwidth' line: the run did not finish")
    if oob is None and rows and all(r["wrong"] is None for r in rows):
        warnings.append("data validation results not printed")
    ok = (
        bool(rows)
        and not errors
        and not oob_failed
        and not avg_failed
        and (oob or 0) == 0
        and all((r["wrong"] or 0) == 0 for r in rows)
        and avg is not None
    )
    return {
        "tool": "nccl-tests",
        "format": "text",
        "op": op,
        "nranks": ranks or None,
        "rows": rows,
        "avg_busbw_gbs": avg,
        "largest": _summarise(rows),
        "out_of_bounds": oob,
        "ok": ok,
        "errors": errors,
        "warnings": warnings,
    }


def _json_group(rec: dict[str, Any], key: str) -> tuple[float | None, float | None, int | None]:
    g = rec.get(key)
    if not isinstance(g, dict):
        return None, None, None

    def num(v: Any) -> float | None:
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

    wrong = num(g.get("nwrong"))
    return num(g.get("alg_bw")), num(g.get("bus_bw")), None if wrong is None else int(wrong)


def _parse_json(doc: dict[str, Any]) -> dict[str, Any]:
    results = doc.get("results")
    if not isinstance(results, list):
        raise ParseError("nccl-tests: JSON document has no 'results' list; not an nccl-tests -J file")
    rows: list[dict[str, Any]] = []
    for rec in results:
        if not isinstance(rec, dict) or not isinstance(rec.get("size"), int):
            continue
        oa, ob, ow = _json_group(rec, "out_of_place")
        ia, ib, iw = _json_group(rec, "in_place")
        wrongs = [w for w in (ow, iw) if w is not None]
        rows.append(
            {
                "size_bytes": rec["size"],
                "count": rec.get("count"),
                "type": rec.get("type"),
                "oop_algbw_gbs": oa,
                "oop_busbw_gbs": ob,
                "ip_algbw_gbs": ia,
                "ip_busbw_gbs": ib,
                "wrong": sum(wrongs) if wrongs else None,
            }
        )
    args = doc.get("args")
    op = _op_name(args[0]) if isinstance(args, list) and args and isinstance(args[0], str) else None
    config = doc.get("config")
    devices = config.get("devices") if isinstance(config, dict) else None
    oob_raw = doc.get("out_of_bounds")
    oob: dict[str, Any] = oob_raw if isinstance(oob_raw, dict) else {}
    avg_raw_doc = doc.get("average_bus_bandwidth")
    avg_doc: dict[str, Any] = avg_raw_doc if isinstance(avg_raw_doc, dict) else {}
    avg_raw = avg_doc.get("bandwidth")
    avg = float(avg_raw) if isinstance(avg_raw, int | float) else None
    errors = [e for e in doc.get("errors", []) if isinstance(e, str) and e]
    oob_count = oob.get("count") if isinstance(oob.get("count"), int) else None
    ok = (
        bool(rows)
        and not errors
        and oob_count in (0, None)
        and avg_doc.get("okay") != "false"
        and all((r["wrong"] or 0) == 0 for r in rows)
        and avg is not None
    )
    return {
        "tool": "nccl-tests",
        "format": "json",
        "op": op,
        "nranks": len(devices) if isinstance(devices, list) else None,
        "rows": rows,
        "avg_busbw_gbs": avg,
        "largest": _summarise(rows),
        "out_of_bounds": oob_count,
        "ok": ok,
        "errors": errors,
        "warnings": [],
    }


def parse_nccl_tests(text: str) -> dict[str, Any]:
    """Parse nccl-tests stdout (any column vintage) or the JSON file written by ``-J``."""
    require_text("nccl-tests", text)
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            doc = json.loads(stripped)
        except (json.JSONDecodeError, RecursionError) as exc:
            kind = exc.__class__.__name__
            raise ParseError(f"nccl-tests: input starts with '{{' but is not valid JSON ({kind})") from None
        if not isinstance(doc, dict):
            raise ParseError("nccl-tests: JSON input is not an object")
        return _parse_json(doc)
    return _parse_text(text)
