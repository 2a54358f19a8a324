"""Parser for the perftest bandwidth tools: ``ib_write_bw``, ``ib_read_bw``, ``ib_send_bw``.

The same parser serves server and client, host memory and CUDA (``--use_cuda``) runs,
``--report_gbits`` and the default MB/sec columns. perftest's "MB/sec" is MiB/s
(``bytes / 2**20`` per second), so it is converted to Gb/s with ``2**20 * 8 / 1e9``.

``test`` is the verb exactly as the header prints it (``RDMA_Write``, ``RDMA_Read``,
``Send``, ``RDMA_Write_imm``, ``Send_imm``, ``Atomic``: perftest's ``testsStr``);
``program`` is the binary that prints that verb (``ib_write_bw``...). A run that failed
before or after its header (no device, QP transition refused, rdma_cm rejected, the peer
vanished mid-exchange) is still perftest output: it parses to ``ok: false`` with the error
lines, never to "not perftest output". The error strings recognised here are perftest's
own (``src/perftest_resources.c``, ``perftest_communication.c``, ``*_bw.c`` in
linux-rdma/perftest).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from provisioner.errors import ParseError
from provisioner.parsers._common import require_text, to_float, to_int

MIB_PER_S_TO_GBPS = 2**20 * 8 / 1e9

_TEST_RE = re.compile(
    r"^\s*(?P<verb>RDMA_Write_imm|RDMA_Write|RDMA_Read|Send_imm|Send|Atomic)\s+"
    r"(?:(?:CMP_AND_SWAP|FETCH_AND_ADD)\s+)?(?P<bidir>Bidirectional\s+)?(?:Post List\s+)?BW\s+(?:\w+\s+)?Test\s*$"
)
_LAT_TAIL_RE = re.compile(r"\bLatency Test\s*$")  # searched, with a word before it: `\S+.*\b` backtracked cubically
_COLS_RE = re.compile(r"^\s*#bytes\s+#iterations\s+BW peak\[([A-Za-z/]+)\]\s+BW average\[([A-Za-z/]+)\]")
_ROW_RE = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\b")
_DEVICE_RE = re.compile(r"\bDevice\s*:\s*(\S+)")
_REMOTE_RE = re.compile(r"^\s*remote address:", re.MULTILINE)
_CUDA_DEV_RE = re.compile(r"\[pid = \d+, dev = (\d+)\]|Picking device No\. (\d+)|Using ROCm Device with ID: (\d+)")
_CUDA_MARK_RE = re.compile(
    r"initializing CUDA|cuMemAlloc|CUDA device|use_cuda|supports CUDA|Using ROCm Device|Use ROCm memory\s*:\s*ON",
    re.IGNORECASE,
)
_ERROR_RE = re.compile(r"\b(?:fail(?:ed|ure)?|error|couldn't|could not|unable to)\b|syndrom", re.IGNORECASE)
#: Lines perftest prints that look alarming but are not a failure of the run: kept as warnings.
_NOT_ERRORS = (
    "Perftest doesn't supports CUDA",
    "Conflicting CPU frequency",
    "libibverbs: Warning:",
    "WARNING: BW peak won't be measured",
)
#: Lines perftest prints on failure (start of the stripped line); they make a text perftest output on
#: their own, so an error-only run parses instead of being rejected.
_PERFTEST_ERRORS = (
    "Unable to init the socket connection",
    "Couldn't connect to ",
    "Unable to open file descriptor for socket connection",
    "Couldn't get device info",
    "Couldn't get device attributes",
    "Couldn't get context for the device",
    "Failed to complete run_iter_bw",
    "Failed to complete run_iter_bi",
    "Completion with error at client",
    "Completion with error at server",
    "Did not detect devices",
    "If device exists, check if driver is up",
    "No IB devices found",
    "Unable to find the Infiniband/RoCE device",
    "Failed to modify QP",
    "Unable to Connect the HCA's through the link",
    "ethernet_read_keys: Couldn't read remote address",
    "ethernet_read_data: Couldn't read reports",
    "Unable to read to socket/rdma_cm",
    "Unable to read to socket/rdam_cm",
    "Unable to write to socket/rdma_cm",
    "Failed to exchange data between server and clients",
    "Unable to perform rdma_client function",
    "Unable to perform rdma_server function",
    "Unable to create RDMA_CM resources",
    "RDMA CM event error",
    "Failed to handle RDMA CM event",
    "Failed to connect RDMA CM events",
    "rdma_resolve_addr failed",
    "rdma_resolve_route failed",
    "rdma_bind_addr failed",
    "rdma_listen failed",
    "rdma_create_event_channel failed",
    "Unable to create QP.",
    "Failed to create QP.",
    "Couldn't create IB resources",
    "Couldn't allocate MR",
    "Couldn't set the link layer",
    "Unable to set up socket connection",
    "Failed to negotiate parameters",
    "Couldn't listen to port",
    "Found Incompatibility issue with GID types",
)
#: ``ib_write_bw: unrecognized option '--use_cuda=0'`` (getopt, a perftest built without CUDA).
_OPTION_RE = re.compile(r"^(?:\S*/)?ib_(?:write|read|send|atomic)_bw: (?:unrecognized|invalid|unknown) option\b")
_PORT_DOWN_RE = re.compile(r"^Port number \d+ state is Down$")
_IB_DEVICE_NOT_FOUND_RE = re.compile(r"^IB device \S+ not found$")

#: Header verb -> the perftest program that prints it.
_PROGRAMS = {
    "RDMA_Write": "ib_write_bw",
    "RDMA_Write_imm": "ib_write_bw",
    "RDMA_Read": "ib_read_bw",
    "Send": "ib_send_bw",
    "Send_imm": "ib_send_bw",
    "Atomic": "ib_atomic_bw",
}


def _to_gbps(value: float, unit: str) -> float:
    """Convert one bandwidth figure to Gb/s (1e9 bit/s) from the unit the header names."""
    u = unit.lower()
    if u.startswith("gb"):
        return value
    if u in ("mb/sec", "mib/sec"):
        return round(value * MIB_PER_S_TO_GBPS, 6)
    raise ParseError(f"perftest: unknown bandwidth unit {unit!r}")


def _is_perftest_error(stripped: str) -> bool:
    return (
        stripped.startswith(_PERFTEST_ERRORS)
        or bool(_OPTION_RE.match(stripped))
        or bool(_PORT_DOWN_RE.match(stripped))
        or bool(_IB_DEVICE_NOT_FOUND_RE.match(stripped))
    )


def _looks_like_perftest(lines: list[str]) -> bool:
    for line in lines:
        s = line.strip()
        if _TEST_RE.match(line) or _COLS_RE.match(line) or "Waiting for client to connect" in s:
            return True
        if _is_perftest_error(s):
            return True
    return False


def _is_latency_header(line: str) -> bool:
    """``RDMA_Write Latency Test``: a line ending in 'Latency Test' after some other word (linear in the line)."""
    m = _LAT_TAIL_RE.search(line)
    return m is not None and bool(line[: m.start()].strip())


def parse_perftest(text: str) -> dict[str, Any]:
    """Parse one side (server or client) of an ib_*_bw run, or the error it printed instead."""
    require_text("perftest", text)
    lines = text.splitlines()
    if not _looks_like_perftest(lines):
        if any(_is_latency_header(line) for line in lines):
            raise ParseError("perftest: this is a latency test (ib_*_lat); only bandwidth tests are parsed")
        raise ParseError("perftest: no 'BW Test' header, '#bytes' table or perftest error line; not ib_*_bw output")
    scan = _PerftestScan()
    for line in lines:
        scan.feed(line)
    results, errors, cuda_device = scan.results, scan.errors, scan.cuda_device
    gpudirect = bool(_CUDA_MARK_RE.search(text))
    if gpudirect and cuda_device is None and "picking first" in text:
        cuda_device = 0
    if "Waiting for client to connect" in text:
        role: str | None = "server"
    elif results or _REMOTE_RE.search(text):
        role = "client"
    else:
        role = None
    error = errors[0] if errors else None
    if not results and error is None:
        error = "no bandwidth results were printed"
    largest = max(results, key=lambda r: r["bytes"]) if results else None
    return {
        "tool": "perftest",
        "ok": error is None,
        "role": role,
        "test": scan.test,
        "program": _PROGRAMS.get(scan.test) if scan.test else None,
        "bidirectional": scan.bidirectional,
        "device": scan.device,
        "gpudirect": gpudirect,
        "cuda_device": cuda_device,
        "results": results,
        "bw_avg_gbps": largest["bw_avg_gbps"] if largest else None,
        "error": error,
        "errors": errors,
        "warnings": scan.warnings,
    }


@dataclass
class _PerftestScan:
    """What the lines of one perftest side say, read one line at a time."""

    test: str | None = None
    bidirectional: bool = False
    device: str | None = None
    unit: str | None = None
    cuda_device: int | None = None
    results: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def feed(self, line: str) -> None:
        m = _TEST_RE.match(line)
        if m:
            self.test = m.group("verb")
            self.bidirectional = m.group("bidir") is not None
            return
        m = _COLS_RE.match(line)
        if m:
            self.unit = m.group(2)
            return
        if self.unit is not None:
            r = _ROW_RE.match(line)
            if r:
                self.results.append(_result_row(r, self.unit))
                return
        if self.device is None:
            d = _DEVICE_RE.search(line)
            if d:
                self.device = d.group(1)
        c = _CUDA_DEV_RE.search(line)
        if c and self.cuda_device is None:
            self.cuda_device = to_int(c.group(1) or c.group(2) or c.group(3))
        self._note(line.strip())

    def _note(self, stripped: str) -> None:
        """A warning perftest printed, or an error line."""
        if stripped.startswith(_NOT_ERRORS):
            if not stripped.startswith("Perftest doesn't supports CUDA"):
                self.warnings.append(stripped)
            return
        if stripped.startswith(("#", "-")):
            return
        if _is_perftest_error(stripped) or _ERROR_RE.search(stripped) or stripped.startswith("ERRNO:"):
            self.errors.append(stripped)


def _result_row(r: re.Match[str], unit: str) -> dict[str, Any]:
    peak, avg = float(r.group(3)), float(r.group(4))
    return {
        "bytes": int(r.group(1)),
        "iterations": int(r.group(2)),
        "bw_peak_gbps": _to_gbps(peak, unit),
        "bw_avg_gbps": _to_gbps(avg, unit),
        "msg_rate_mpps": to_float(r.group(5)),
    }


# --- CUDA support of a perftest build (added for the gpudirect check) ----------------------------------------
# perftest's usage() lists --use_cuda only when built with CUDA (``#ifdef HAVE_CUDA`` before 23.07,
# ``cuda_memory_supported()`` after) and --use_cuda_dmabuf only with HAVE_CUDA_DMABUF. A build without them
# refuses the option: glibc getopt_long's "unrecognized option" (options compiled out, e.g. Debian's 4.5+0.17),
# " Unsupported memory type" (23.07+: parsed, then refused), or "DMABUF requested but not supported in this build".
_USAGE_CUDA_RE = re.compile(r"^\s+--use_cuda=<", re.MULTILINE)
_USAGE_DMABUF_RE = re.compile(r"^\s+--use_cuda_dmabuf\b", re.MULTILINE)
_CUDA_REFUSED_RE = re.compile(
    r"unrecognized option '--use_cuda[^']*'|^ ?Unsupported memory type$"
    r"|DMABUF requested but not supported in this build",
    re.MULTILINE,
)


def cuda_options(text: str) -> dict[str, Any]:
    """Which GPU memory options a perftest build has, from its ``--help`` or from a run it refused.

    ``refused`` is the line in which the build rejects a CUDA option (None when it did not).
    """
    refused = _CUDA_REFUSED_RE.search(text or "")
    return {
        "use_cuda": bool(_USAGE_CUDA_RE.search(text or "")),
        "use_cuda_dmabuf": bool(_USAGE_DMABUF_RE.search(text or "")),
        "refused": refused.group(0).strip() if refused else None,
    }
