"""Parser for ``dcgmi diag -r N`` (DCGM's diagnostic table, 3.x and 4.x layouts).

The table (NVIDIA/DCGM ``dcgmi/Diag.cpp``) is two columns, ``| name | result |``, 78 characters wide, cut into
sections by rows such as ``|-----  Deployment  --------+---...|`` or ``+-----  Hardware  ----------+---...+``:
Metadata (key/value rows), Deployment, Integration, Hardware, Stress. A test row's result reads

- DCGM 3.x: ``Pass``, ``Fail``, ``Skip``, ``Warn``, each alone or with the GPUs it covers (``Pass - All``,
  ``Fail - GPU: 0``, ``Pass - GPUs: 1, 2, 3``); a test split between results has one more row per result with an
  empty name cell;
- DCGM 4.x: the overall result on the test row, then one row per GPU with an empty name cell (``GPU0: Pass``).

``Error``, ``Warning`` and ``Info`` rows carry DCGM's own words for the test above them (or the section, when no
test came yet). Long words are wrapped at a fixed 45-character column, mid-word: the chunks are joined as printed,
never with an added space. ``dcgmi`` itself failing (no host engine: ``Error: Unable to connect to host engine.
...``) is this tool's output with ``ok: false`` and the ``error``.
"""

from __future__ import annotations

import re
from typing import Any

from provisioner.errors import ParseError
from provisioner.parsers._common import require_text

RESULTS = ("pass", "fail", "warn", "skip")
"""What a test can read, lowercase."""
_SEVERITY = {"fail": 3, "warn": 2, "pass": 1, "skip": 0}
_MESSAGE_KINDS = {"error": "error", "warning": "warning", "info": "info"}
_METADATA_KEYS = {
    "dcgm version": "dcgm_version",
    "driver version detected": "driver_version",
    "gpu device ids detected": "gpu_device_ids",
}
_SECTION_RE = re.compile(r"^[|+]-{3,}\s+(?P<name>[A-Za-z][A-Za-z ]*?)\s+-+\+")
_RESULT_RE = re.compile(r"^(?P<result>Pass|Fail|Skip|Warn)(?:\s*-\s*(?:(?P<all>All)|GPUs?:\s*(?P<gpus>[\d,\s]+)))?$",
                        re.IGNORECASE)
_PER_GPU_RE = re.compile(r"^GPU\s*(?P<gpu>\d+):\s*(?P<result>Pass|Fail|Skip|Warn)$", re.IGNORECASE)
_GPU_IN_TEXT_RE = re.compile(r"\bGPU\s+(\d+)\b")
_DCGMI_ERROR_RE = re.compile(r"^Error:\s*(?P<msg>(?:Unable to connect to host engine|unable to establish a connection "
                             r"to the specified host|Unable to run diagnostic|Diagnostic read from JSON).*)$",
                             re.IGNORECASE)
"""dcgmi's own failure lines (``dcgmi/Command.cpp``, ``dcgmi/Diag.cpp``): no host engine, a diag that did not start."""
_NAME_END = 28
"""Column of the ``|`` between the two cells, counted from the row's first ``|``."""
_CHUNK = 45
"""Width of one wrapped chunk of a message (the result cell's text column)."""


def _cells(row: str) -> tuple[str, str, str]:
    """(name, result text, the raw wrapped chunk) of one ``| ... | ... |`` row."""
    name = row[1:_NAME_END].strip()
    rest = row[_NAME_END + 1:]
    value = rest.rstrip()
    value = value[:-1] if value.endswith("|") else value
    chunk = row[_NAME_END + 2:_NAME_END + 2 + _CHUNK]
    if len(row) <= _NAME_END + 2 + _CHUNK:
        chunk = chunk.rstrip().removesuffix("|").rstrip()
    return name, value.strip(), chunk


def _gpus(text: str) -> list[int]:
    return sorted({int(g) for g in re.findall(r"\d+", text)})


class _Table:
    """The rows read so far: metadata, tests in order, the message being continued."""

    def __init__(self) -> None:
        self.metadata: dict[str, str] = {}
        self.tests: list[dict[str, Any]] = []
        self.section: str | None = None
        self.test: dict[str, Any] | None = None
        self.message: dict[str, Any] | None = None
        self.section_messages: list[dict[str, Any]] = []
        self.rows = 0

    def row(self, row: str) -> None:
        name, value, chunk = _cells(row)
        if name.lower() in ("diagnostic",) and value.lower() == "result":
            return
        self.rows += 1
        kind = _MESSAGE_KINDS.get(name.lower())
        if kind:
            self.message = {"kind": kind, "text": chunk}
            if self.test is not None:
                self.test["messages"].append(self.message)
            else:
                self.section_messages.append({**self.message, "section": self.section})
                self.message = self.section_messages[-1]
        elif name:
            self._named(name, value)
        else:
            self._continued(value, chunk)

    def _named(self, name: str, value: str) -> None:
        self.message = None
        if self.section and self.section.lower() == "metadata":
            self.metadata[_METADATA_KEYS.get(name.lower(), name.lower().replace(" ", "_"))] = value
            self.test = None
            return
        self.test = {"section": self.section, "name": name, "results": [], "messages": []}
        self.tests.append(self.test)
        self._result(value)

    def _result(self, value: str) -> bool:
        assert self.test is not None
        m = _RESULT_RE.match(value)
        if m:
            gpus = None if m.group("all") or not m.group("gpus") else _gpus(m.group("gpus"))
            self.test["results"].append({"result": m.group("result").lower(), "gpus": gpus})
            return True
        m = _PER_GPU_RE.match(value)
        if m:
            self.test["results"].append({"result": m.group("result").lower(), "gpus": [int(m.group("gpu"))]})
            return True
        return False

    def _continued(self, value: str, chunk: str) -> None:
        if self.message is not None:
            self.message["text"] += chunk
        elif self.test is not None and value and not self._result(value):
            self.test["messages"].append({"kind": "info", "text": value})


def _finish_test(test: dict[str, Any]) -> dict[str, Any]:
    results = test["results"]
    for msg in test["messages"]:
        msg["text"] = " ".join(msg["text"].split())
        msg["gpus"] = sorted({int(g) for g in _GPU_IN_TEXT_RE.findall(msg["text"])})
    overall = max((r["result"] for r in results), key=_SEVERITY.__getitem__, default=None)
    per_gpu = [r for r in results if r["gpus"] is not None]
    failed: list[int] | None = sorted({g for r in per_gpu if r["result"] == "fail" for g in r["gpus"]})
    if any(r["result"] == "fail" and r["gpus"] is None for r in results) and not failed:
        named = sorted({g for m in test["messages"] if m["kind"] in ("error", "warning") for g in m["gpus"]})
        failed = named or None
    return {**test, "result": overall, "failed_gpus": failed if overall == "fail" else []}


def _not_a_table(text: str) -> dict[str, Any]:
    errors = [m.group("msg").strip() for line in text.splitlines() if (m := _DCGMI_ERROR_RE.match(line.strip()))]
    if errors:
        return {"tool": "dcgmi", "ok": False, "error": errors[-1], "errors": errors, "metadata": {}, "tests": [],
                "failed": [], "warnings": []}
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    raise ParseError(f"dcgmi: no 'dcgmi diag' result table (first line: {first[:80]!r})")


def parse_dcgmi_diag(text: str) -> dict[str, Any]:
    """Parse ``dcgmi diag`` output into ``metadata``, ``tests: [{section, name, result, results, failed_gpus,
    messages}]``, ``failed`` (names of failed tests) and ``ok`` (no test failed)."""
    require_text("dcgmi", text)
    table = _Table()
    for raw in text.splitlines():
        line = raw.strip()
        section = _SECTION_RE.match(line)
        if section:
            table.section, table.test, table.message = section.group("name").strip(), None, None
            table.rows += 1
        elif line.startswith("|") and len(line) > _NAME_END and line[_NAME_END] == "|":
            table.row(line)
        elif line.startswith("+") and set(line) <= set("+-="):
            table.test, table.message = None, None
    if not table.rows:
        return _not_a_table(text)
    tests = [_finish_test(t) for t in table.tests]
    warnings = [f"test {t['name']!r} has no result" for t in tests if t["result"] is None]
    messages = [{**m, "text": " ".join(m["text"].split()),
                 "gpus": sorted({int(g) for g in _GPU_IN_TEXT_RE.findall(m["text"])})}
                for m in table.section_messages]
    failed = [t["name"] for t in tests if t["result"] == "fail"]
    errors = [m for m in messages if m["kind"] == "error"]
    return {"tool": "dcgmi", "ok": not failed and not errors, "error": None, "errors": [],
            "metadata": table.metadata, "tests": tests, "section_messages": messages, "failed": failed,
            "warnings": warnings}
