"""Simulated perftest (``ib_write_bw``, ``ib_read_bw``, ``ib_send_bw``), stdlib only.

Like the real perftest, the server is the side started without a host argument; it
waits on TCP port 18515 (``-p``) and the client connects to it.  Both sides exchange
their port's attributes over that socket (the real tool exchanges LID/QPN/PSN/RKey/VAddr
the same way, "Data ex. method : Ethernet"), then both print perftest's banner and the
result table, with the bandwidth derived from the link model of both ports.

Formats follow perftest's own ``printf`` strings (Debian perftest 4.5-0.17 binary
``/usr/bin/ib_write_bw``, and captured runs in linux-rdma/perftest issues #132, #214,
#234, #31, #126).  Result line: `` %-7lu    %-10lu       %-7.2lf            %-7.2lf\\t\\t   %-7.6lf``.

Bandwidth model (documented in docs/lab-hardware-model.md, "Tool models" and "Fabric routes"):
the flow's max-min fair share of the fabric (``fabsim_fabric.fair_share``: its ports' rates x bw_factor and
the switch-to-switch links on its route, shared with the flows running at the same time; alone on one leaf
that is ``min(rate_a * bw_factor_a, rate_b * bw_factor_b)``) ``* efficiency``, efficiency 0.98 at
large messages (NDR 400 Gb/s ports report ~392 Gb/s), capped at small sizes by a message
rate of 2.64 Mpps (perftest issue #132: 2-byte writes at 2.636533 Mpps), times a
deterministic +-0.3 % jitter.  GPUDirect (``--use_cuda``) costs another 1.5 %.

Each installed copy is one *build* (:class:`Build`, written into the script by the package that
installs it): the upstream release it behaves as and what its ``configure`` found.  The stock build
(Debian bookworm's perftest 4.5+0.17, no ``CUDA_H_PATH``) has no ``--use_cuda`` in its getopt table, as
upstream before 23.07 compiled the option only ``#ifdef HAVE_CUDA``; from 23.07 on the option is always
parsed and a build without CUDA refuses it with " Unsupported memory type".  A CUDA build with
``--use_cuda_dmabuf`` (``HAVE_CUDA_DMABUF``: CUDA >= 11.7 headers, rdma-core with ``ibv_reg_dmabuf_mr``)
registers GPU memory through DMA-BUF: no ``nvidia_peermem`` needed, but the GPU must report DMA-BUF
support (open kernel modules) and the kernel must register dma-buf MRs (Linux >= 5.12).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

try:
    from provisioner.lab.simtools import fabsim_common as common
    from provisioner.lab.simtools import fabsim_fabric as fabric
    from provisioner.lab.simtools import labstate
except ImportError:  # inside a node
    import fabsim_common as common  # type: ignore[import-not-found,no-redef]
    import fabsim_fabric as fabric  # type: ignore[import-not-found,no-redef]
    import labstate  # type: ignore[import-not-found,no-redef]

DEFAULT_PORT = 18515
DASHES = "-" * 87
EFFICIENCY = 0.98
GDR_EFFICIENCY = 0.985
MAX_MSG_RATE = 2.64e6
JITTER = 0.003
TESTS = {
    "ib_write_bw": "RDMA_Write",
    "ib_read_bw": "RDMA_Read",
    "ib_send_bw": "Send",
}
STATE_NAMES = {"nop": "Nop", "down": "Down", "init": "Init", "armed": "Armed"}
"""perftest's portStates[] names, printed by `` Port number %d state is %s``."""
CUDA_OPTIONS = ("--use_cuda", "--use_cuda_bus_id", "--use_cuda_dmabuf")
DMABUF_MIN_KERNEL = (5, 12)
"""Linux release that added dma-buf memory registration to ib_uverbs (``ibv_reg_dmabuf_mr``)."""
EFAULT, EPROTONOSUPPORT = 14, 93


def version_key(version: str) -> tuple[int, ...]:
    """``4.5-0.17`` -> (4, 5, 0, 17); ``25.10.0-0.128`` -> (25, 10, 0, 0, 128)."""
    out: list[int] = []
    for part in version.replace("-", ".").split("."):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


@dataclass(frozen=True)
class Build:
    """How one installed perftest was compiled (the lab's packages write it into the script).

    The defaults are Debian bookworm's ``perftest`` 4.5+0.17: configured without ``CUDA_H_PATH``.
    """

    version: str = "4.5-0.17"
    cuda: bool = False
    cuda_dmabuf: bool = False

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Build:
        data = data or {}
        return cls(
            version=str(data.get("version", cls.version)),
            cuda=bool(data.get("cuda", False)),
            cuda_dmabuf=bool(data.get("cuda_dmabuf", False)),
        )

    @property
    def memory_types_static(self) -> bool:
        """23.07 and later parse every memory-type option and refuse unsupported ones afterwards."""
        return version_key(self.version) >= (23, 7)

    @property
    def mr_errno(self) -> bool:
        """23.04 and later print ``Couldn't allocate MR with error=<errno>``."""
        return version_key(self.version) >= (23, 4)

    @property
    def usage_note(self) -> bool:
        """25.07 and later print the "SYMMETRIC" note under the usage lines."""
        return version_key(self.version) >= (25, 7)


class PerftestFailure(Exception):
    """A failure perftest reports on stderr before exiting with status 1."""

    def __init__(self, lines: Sequence[str], stdout_lines: Sequence[str] = ()) -> None:
        super().__init__("\n".join(lines))
        self.lines = list(lines)
        self.stdout_lines = list(stdout_lines)


@dataclass(frozen=True)
class Options:
    """The perftest options the simulation honours (others are accepted and ignored)."""

    tool: str
    device: str | None
    ib_port: int
    gid_index: int | None
    size: int
    all_sizes: bool
    iters: int
    report_gbits: bool
    bidirectional: bool
    duration: int | None
    use_cuda: int | None
    use_cuda_dmabuf: bool
    tcp_port: int
    qps: int
    host: str | None


def usage(tool: str, build: Build) -> list[str]:
    """The start of perftest's usage() for a BW test, with the CUDA lines only where they are compiled in.

    A subset of the real option list (perftest prints some 80 options); each line is printed as the
    real ``printf`` pair prints it.
    """
    lines = [
        "Usage:",
        f"  {tool}            start a server and wait for connection",
        f"  {tool} <host>     connect to server at <host>",
        "",
    ]
    if build.usage_note:
        lines += ["Note: Some options must match on both server and client for consistent behavior "
                  "(marked 'SYMMETRIC').", ""]
    lines += [
        "Options:",
        "  -a, --all  Run sizes from 2 till 2^23",
        "  -b, --bidirectional  Measure bidirectional bandwidth (default unidirectional)",
        "  -d, --ib-dev=<dev>  Use IB device <dev> (default first device found)",
        "  -D, --duration  Run test for a customized period of seconds.",
        "  -i, --ib-port=<port>  Use port <port> of IB device (default 1)",
        "  -s, --size=<size>  Size of message to exchange (default 65536)",
        "      --report_gbits  Report Max/Average BW of test in Gbit/sec (instead of MiB/sec)",
        "      --tclass=<value>  Set the Traffic Class in GRH (if GRH is in use)",
    ]
    if build.cuda:
        lines += [
            "      --use_cuda=<cuda device id> Use CUDA specific device for GPUDirect RDMA testing",
            "      --use_cuda_bus_id=<cuda full BUS id> Use CUDA specific device, based on its full PCIe address, "
            "for GPUDirect RDMA testing",
        ]
        if build.cuda_dmabuf:
            lines += [
                "      --use_cuda_dmabuf Use CUDA DMA-BUF for GPUDirect RDMA testing",
                "      --use_cuda_pcie_mapping Use CUDA DMABUF handle mapping via PCIe BAR1",
            ]
    return lines


PARSER_ERROR = " Parser function exited with Error"
"""What perftest's main() prints when parser() fails (not after --help)."""


class HelpExit(Exception):
    """``-h``/``--help``: usage on stdout, and main() returns FAILURE without an error line."""


def _compiled_options(build: Build) -> set[str]:
    """The CUDA long options in this build's getopt table."""
    if build.memory_types_static:
        return set(CUDA_OPTIONS)
    compiled = set()
    if build.cuda:
        compiled |= {"--use_cuda", "--use_cuda_bus_id"}
    if build.cuda_dmabuf:
        compiled.add("--use_cuda_dmabuf")
    return compiled


def _check_memory_options(argv: Sequence[str], build: Build) -> str | None:
    """What parser() says about the memory-type options, in command-line order (as getopt_long walks them).

    Returns the first option this build's getopt table lacks; raises what parser() prints for the others.
    """
    compiled = _compiled_options(build)
    cuda_seen = False
    for arg in argv:
        name = arg.split("=", 1)[0]
        if name not in CUDA_OPTIONS:
            continue
        if name not in compiled:
            return arg
        supported = build.cuda and (name != "--use_cuda_dmabuf" or build.cuda_dmabuf)
        if not supported:
            raise PerftestFailure([PARSER_ERROR], [" Unsupported memory type"])
        if name == "--use_cuda_dmabuf" and not cuda_seen:
            raise PerftestFailure(["CUDA DMA-BUF cannot be used without CUDA", PARSER_ERROR])
        cuda_seen = cuda_seen or name in ("--use_cuda", "--use_cuda_bus_id")
    return None


def parse_args(tool: str, argv: Sequence[str], build: Build | None = None) -> Options:
    """Parse perftest's command line (getopt-style short and long options) as ``build`` would."""
    build = build or Build()
    if any(a in ("-h", "--help") for a in argv):
        raise HelpExit()
    invalid = [" Invalid Command or flag.", " Please check command line and run again.", ""]
    bad = _check_memory_options(argv, build)
    if bad is not None:  # glibc getopt_long's message, then perftest's default case and usage()
        raise PerftestFailure([f"{tool}: unrecognized option '{bad}'", *invalid, PARSER_ERROR], usage(tool, build))
    parser = argparse.ArgumentParser(prog=tool, add_help=False, exit_on_error=False)
    parser.add_argument("-d", "--ib-dev", dest="device")
    parser.add_argument("-i", "--ib-port", type=int, default=1)
    parser.add_argument("-x", "--gid-index", type=int)
    parser.add_argument("-s", "--size", type=int, default=65536)
    parser.add_argument("-a", "--all", action="store_true")
    parser.add_argument("-n", "--iters", type=int, default=5000)
    parser.add_argument("-F", "--CPU-freq", action="store_true")
    parser.add_argument("--report_gbits", action="store_true")
    parser.add_argument("-b", "--bidirectional", action="store_true")
    parser.add_argument("-D", "--duration", type=int)
    if "--use_cuda" in _compiled_options(build):
        parser.add_argument("--use_cuda", nargs="?", const=0, type=int)
    if "--use_cuda_dmabuf" in _compiled_options(build):
        parser.add_argument("--use_cuda_dmabuf", action="store_true")
    parser.add_argument("-p", "--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("-q", "--qp", type=int, default=1)
    parser.add_argument("-c", "--connection", default="RC")
    parser.add_argument("-m", "--mtu", type=int)
    parser.add_argument("-t", "--tx-depth", type=int)
    parser.add_argument("-R", "--rdma_cm", action="store_true")
    parser.add_argument("--output")
    parser.add_argument("host", nargs="?")
    try:
        ns, unknown = parser.parse_known_args(list(argv))
    except argparse.ArgumentError as exc:
        raise PerftestFailure([f" Invalid command line: {exc}"]) from exc
    if unknown:
        raise PerftestFailure([f"{tool}: unrecognized option '{unknown[0]}'", *invalid, PARSER_ERROR],
                              usage(tool, build))
    return Options(
        tool=tool,
        device=ns.device,
        ib_port=ns.ib_port,
        gid_index=ns.gid_index,
        size=ns.size,
        all_sizes=ns.all,
        iters=ns.iters,
        report_gbits=ns.report_gbits,
        bidirectional=ns.bidirectional,
        duration=ns.duration,
        use_cuda=getattr(ns, "use_cuda", None),
        use_cuda_dmabuf=bool(getattr(ns, "use_cuda_dmabuf", False)),
        tcp_port=ns.port,
        qps=ns.qp,
        host=ns.host,
    )


# ---------------------------------------------------------------- local checks (pure)


def select_port(node: dict[str, Any], device: str | None, ib_port: int) -> dict[str, Any]:
    """The node.json port perftest would open, or the failure perftest prints."""
    hcas: list[dict[str, Any]] = node.get("hcas", [])
    if not hcas:
        raise PerftestFailure(["No IB devices found", " Unable to find the Infiniband/RoCE device"])
    name = device or str(hcas[0]["device"])
    ports = [h for h in hcas if h.get("device") == name]
    if not ports:
        raise PerftestFailure([f"IB device {name} not found", " Unable to find the Infiniband/RoCE device"])
    for hca in ports:
        if int(hca.get("port", 1)) == ib_port:
            return hca
    raise PerftestFailure([" Couldn't get context for the device"])


def check_link(hca: dict[str, Any], ib_port: int) -> None:
    """perftest refuses a port that is not Active (check_link -> set_link_layer)."""
    if hca.get("state") != "active":
        state = STATE_NAMES.get(str(hca.get("state")), "Down")
        raise PerftestFailure([f" Port number {ib_port} state is {state}", " Couldn't set the link layer"])


def kernel_release(node: dict[str, Any]) -> str:
    """The node's kernel: node.json ``kernel`` when set (tests rehearse an old one), else the running kernel."""
    return str(node.get("kernel") or os.uname().release)


def _mr_failure(build: Build, errno: int) -> list[str]:
    """ibv_reg_mr/ibv_reg_dmabuf_mr failed: perftest's create_single_mr -> create_mr -> ctx_init chain."""
    first = f"Couldn't allocate MR with error={errno}" if build.mr_errno else "Couldn't allocate MR"
    return [first, "failed to create mr", "Failed to create MR", " Couldn't create IB resources"]


def cuda_lines(
    node: dict[str, Any],
    index: int,
    modules: list[str],
    driver: bool,
    build: Build | None = None,
    dmabuf: bool = False,
    flavor: str | None = None,
) -> list[str]:
    """What perftest prints while setting up a GPU buffer; raises when it cannot.

    Needs a driver and a present GPU ``index``.  Then the memory registration: through
    ``nvidia_peermem`` (without it "Couldn't allocate MR", perftest issues #31/#126/#346), or with
    ``dmabuf`` through DMA-BUF, which needs the open kernel modules (``flavor``; the proprietary ones do
    not report CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED) and a kernel >= 5.12, but no nvidia_peermem.
    """
    build = build or Build(cuda=True)
    gpus = [g for g in node.get("gpus", []) if g.get("present", True)]
    lines = ["initializing CUDA"]
    if not driver or not gpus:
        raise PerftestFailure(
            ["cuInit(0) returned 100", "Couldn't init GPU context", " Couldn't create IB resources"], lines
        )
    lines.append("Listing all CUDA devices in system:")
    for i, gpu in enumerate(gpus):
        bus = str(gpu.get("pci_bus_id", "00000000:00:00.0")).split(":")
        lines.append(f"CUDA device {i}: PCIe address is {bus[1].upper()}:{bus[2][:2].upper()}")
    if index >= len(gpus):
        raise PerftestFailure([f"No CUDA device {index}", " Couldn't create IB resources"], lines)
    lines += [
        "",
        f"Picking device No. {index}",
        f"[pid = {os.getpid()}, dev = {index}] device name = [{gpus[index].get('name', '')}]",
        "creating CUDA Ctx",
        "making it the current CUDA Ctx",
    ]
    if dmabuf:
        if flavor != "open":
            raise PerftestFailure(
                ["DMA-BUF is not supported on this GPU", "Failed to init memory", " Couldn't create IB resources"],
                lines,
            )
        if version_key(kernel_release(node)) < DMABUF_MIN_KERNEL:
            raise PerftestFailure(_mr_failure(build, EPROTONOSUPPORT), lines)
        return lines
    if "nvidia_peermem" not in modules:
        raise PerftestFailure(_mr_failure(build, EFAULT), lines)
    return lines


def port_info(hca: dict[str, Any], opts: Options, gpu_ok: bool) -> dict[str, Any]:
    """What one side sends the other during the exchange."""
    return {
        "host": common.this_host(),
        "device": str(hca.get("device")),
        "ib_port": int(hca.get("port", 1)),
        "lid": int(hca.get("lid", 0)),
        "guid": str(hca.get("port_guid", "0x0")),
        "rate_gbps": float(hca.get("rate_gbps", 0)),
        "bw_factor": float(hca.get("bw_factor", 1.0)),
        "state": str(hca.get("state")),
        "flapping": bool(hca.get("flapping")),
        "link_layer": str(hca.get("link_layer", "InfiniBand")),
        "cuda": gpu_ok,
        "qpn": int(common.unit_hash("qpn", hca.get("port_guid"), os.getpid()) * 0xFFFF),
        "psn": int(common.unit_hash("psn", hca.get("port_guid"), os.getpid()) * 0xFFFFFF),
        "size": opts.size,
        "all": opts.all_sizes,
        "iters": opts.iters,
        "duration": opts.duration,
        "bidirectional": opts.bidirectional,
        "qps": opts.qps,
    }


# ---------------------------------------------------------------- bandwidth model (pure)


def sizes_for(opts: Options) -> list[int]:
    """Message sizes of the run: ``-a`` sweeps 2 B .. 8 MiB like perftest."""
    if opts.all_sizes:
        return [2**k for k in range(1, 24)]
    return [opts.size]


def bandwidth_gbps(local: dict[str, Any], remote: dict[str, Any], size: int, run: str,
                   share: float | None = None) -> float:
    """Average one-way bandwidth in Gb/s for one message size (``share``: the flow's fair share of the fabric)."""
    link = share if share is not None else min(local["rate_gbps"] * local["bw_factor"],
                                               remote["rate_gbps"] * remote["bw_factor"])
    eff = EFFICIENCY * (GDR_EFFICIENCY if (local["cuda"] or remote["cuda"]) else 1.0)
    peak = link * eff
    rate_cap = size * 8 * MAX_MSG_RATE * max(1, int(local["qps"])) / 1e9
    guids = sorted([local["guid"], remote["guid"]])
    return float(min(peak, rate_cap) * common.jitter(JITTER, "bw", run, guids[0], guids[1], size))


def result_rows(local: dict[str, Any], remote: dict[str, Any], opts: Options, run: str,
                share: float | None = None) -> list[str]:
    """The table rows as perftest prints them."""
    rows = []
    for size in sizes_for(opts):
        gbps = bandwidth_gbps(local, remote, size, run, share)
        if opts.bidirectional:
            gbps *= 2 * common.jitter(JITTER, "bidir", run, size)
        bytes_per_s = gbps * 1e9 / 8
        avg = gbps if opts.report_gbits else bytes_per_s / 2**20
        peak = 0.0 if opts.duration else avg * common.jitter(0.001, "peak", run, size) + abs(avg) * 0.0005
        iters = int(bytes_per_s * opts.duration / size) if opts.duration else opts.iters
        msg_rate = bytes_per_s / size / 1e6
        rows.append(f" {size:<7d}    {iters:<10d}       {peak:<7.2f}            {avg:<7.2f}\t\t   {msg_rate:<7.6f}")
    return rows


# ---------------------------------------------------------------- output (pure)


def gid_text(guid: str) -> str:
    """perftest's `` GID: `` line form: 16 bytes printed with ``%02d``."""
    raw = bytes([0xFE, 0x80, 0, 0, 0, 0, 0, 0]) + common.guid_int(guid).to_bytes(8, "big")
    return ":".join(f"{b:02d}" for b in raw)


def banner(opts: Options, hca: dict[str, Any], is_server: bool) -> list[str]:
    """The parameter block perftest prints before the addresses."""
    title = TESTS.get(opts.tool, "RDMA_Write") + (" Bidirectional" if opts.bidirectional else "") + " BW Test"
    link = "IB" if hca.get("link_layer", "InfiniBand") == "InfiniBand" else "Ethernet"
    lines = [
        DASHES,
        f"                    {title}",
        f" Dual-port       : OFF\t\tDevice         : {hca['device']}",
        f" Number of qps   : {opts.qps}\t\tTransport type : IB",
        " Connection type : RC\t\tUsing SRQ      : OFF",
        " PCIe relax order: ON",
        " ibv_wr* API     : ON",
    ]
    if not is_server:
        lines.append(" TX depth        : 128")
    lines += [
        f" CQ Moderation   : {1 if opts.duration else 100}",
        " Mtu             : 4096[B]",
        f" Link type       : {link}",
    ]
    if opts.gid_index is not None or link == "Ethernet":
        lines.append(f" GID index       : {opts.gid_index or 0}")
    lines += [" Max inline data : 0[B]", " rdma_cm QPs\t : OFF", " Data ex. method : Ethernet", DASHES]
    return lines


def address_lines(info: dict[str, Any], which: str, show_gid: bool) -> list[str]:
    """`` local address: LID 0x02 QPN 0x0032 PSN 0x5f2841 RKey 0x002440 VAddr 0x007f...``."""
    rkey = int(common.unit_hash("rkey", info["guid"], info["qpn"]) * 0x1FFFFF)
    vaddr = 0x7F0000000000 + int(common.unit_hash("va", info["guid"], info["qpn"]) * 0xFFFFFFFF) * 0x1000 % (
        0xFFFFFFFFFF
    )
    line = (
        f" {which} address: LID {common.c_hex(info['lid'], 4)} QPN {common.c_hex(info['qpn'], 6)}"
        f" PSN {common.c_hex(info['psn'], 6)} RKey {common.c_hex(rkey, 8)} VAddr {common.c_hex(vaddr, 16)}"
    )
    return [line, f" GID: {gid_text(info['guid'])}"] if show_gid else [line]


def table_header(opts: Options) -> str:
    unit = "Gb/sec" if opts.report_gbits else "MB/sec"
    return f" #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]"


# ---------------------------------------------------------------- the exchange (I/O)


def _send(sock: socket.socket, data: dict[str, Any]) -> None:
    sock.sendall((json.dumps(data) + "\n").encode())


def _recv(sock: socket.socket) -> dict[str, Any]:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            raise PerftestFailure([" Failed to exchange data between server and clients"])
        buf += chunk
    data = json.loads(buf.decode())
    if not isinstance(data, dict):
        raise PerftestFailure([" Failed to exchange data between server and clients"])
    return data


def serve_once(port: int, mine: dict[str, Any]) -> tuple[socket.socket, dict[str, Any]]:
    """Wait for one client on ``port`` (all addresses), then swap port info."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("0.0.0.0", port))  # noqa: S104 - perftest listens on every address
        listener.listen(1)
    except OSError as exc:
        listener.close()
        raise PerftestFailure(
            [f"Couldn't listen to port {port}", " Unable to open file descriptor for socket connection"]
        ) from exc
    conn, _ = listener.accept()
    listener.close()
    peer = _recv(conn)
    _send(conn, mine)
    return conn, peer


def connect_once(host: str, port: int, mine: dict[str, Any], timeout: float) -> tuple[socket.socket, dict[str, Any]]:
    """Connect to the server and swap port info; the real tool's messages on failure."""
    import time

    deadline = time.monotonic() + float(os.environ.get("PROVISIONER_LAB_PERFTEST_RETRY_S", "1.0"))
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
            break
        except OSError as exc:
            if isinstance(exc, ConnectionRefusedError) and time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            raise PerftestFailure(
                [
                    f"Couldn't connect to {host}:{port}",
                    "Unable to open file descriptor for socket connection Unable to init the socket connection",
                ]
            ) from exc
    sock.settimeout(timeout)
    try:
        _send(sock, mine)
        peer = _recv(sock)
    except (OSError, ValueError) as exc:
        sock.close()
        raise PerftestFailure([" Failed to exchange data between server and clients"]) from exc
    return sock, peer


# ---------------------------------------------------------------- entry point


def run(tool: str, argv: Sequence[str], out: TextIO, err: TextIO, build: Build | None = None) -> int:
    """Run one side of the test as ``build`` would; returns the process exit status."""
    build = build or Build()
    try:
        try:
            opts = parse_args(tool, argv, build)
        except HelpExit:
            print("\n".join(usage(tool, build)), file=out)
            return 1
        root, host = common.lab_root(), common.this_host()
        node = labstate.load_node(root, host)
        hca = select_port(node, opts.device, opts.ib_port)
        check_link(hca, opts.ib_port)
        is_server = opts.host is None
        if opts.duration:
            print(" WARNING: BW peak won't be measured in this run.", file=out)
        if is_server:
            print(
                "\n************************************\n* Waiting for client to connect... *\n"
                "************************************",
                file=out,
                flush=True,
            )
        gpu_ok = False
        if opts.use_cuda is not None:
            print("Perftest doesn't supports CUDA tests with inline messages: inline size set to 0", file=out)
            lines = cuda_lines(node, opts.use_cuda, labstate.load_modules(root, host), common.driver_installed(),
                               build, opts.use_cuda_dmabuf, common.driver_flavor())
            print("\n".join(lines), file=out, flush=True)
            gpu_ok = True
        mine = port_info(hca, opts, gpu_ok)
        timeout = float(os.environ.get("PROVISIONER_LAB_PERFTEST_TIMEOUT_S", "10"))
        if is_server:
            conn, peer = serve_once(opts.tcp_port, mine)
        else:
            conn, peer = connect_once(str(opts.host), opts.tcp_port, mine, timeout)
        with conn:
            return _report(opts, hca, mine, peer, is_server, conn, out, err)
    except PerftestFailure as failure:
        if failure.stdout_lines:
            print("\n".join(failure.stdout_lines), file=out)
        out.flush()
        print("\n".join(failure.lines), file=err)
        return 1
    except FileNotFoundError:
        print("No IB devices found", file=err)
        return 1


def _report(
    opts: Options,
    hca: dict[str, Any],
    mine: dict[str, Any],
    peer: dict[str, Any],
    is_server: bool,
    conn: socket.socket,
    out: TextIO,
    err: TextIO,
) -> int:
    """Print banner, addresses and results; a flapping port aborts the run."""
    # The client's parameters rule the run, as in perftest (the server adopts them).
    eff = opts if not is_server else _adopt(opts, peer)
    print("\n".join(banner(eff, hca, is_server)), file=out)
    show_gid = eff.gid_index is not None
    print("\n".join(address_lines(mine, "local", show_gid) + address_lines(peer, "remote", show_gid)), file=out)
    print(DASHES, file=out)
    print(table_header(eff), file=out, flush=True)
    run = common.run_id()
    common.record_flap(common.this_host(), hca, run)  # each end counts its own port's bounces
    if (
        peer.get("state") != "active"
        or common.flaps_now({"flapping": mine["flapping"], "port_guid": mine["guid"]}, run)
        or common.flaps_now({"flapping": peer["flapping"], "port_guid": peer["guid"]}, run)
    ):
        # IBV_WC_RETRY_EXC_ERR (12) when the link drops under the test.
        print("Completion with error at " + ("server" if is_server else "client"), file=err)
        print("Failed status 12: wr_id 0 syndrom 0x81", file=err)
        print(f"scnt={128 if not is_server else 0}, ccnt=0", file=err)
        print(" Failed to complete run_iter_bw function successfully", file=err)
        return 1
    local, remote = (mine, peer) if not is_server else (peer, mine)
    share = _share(conn, is_server, local, remote, eff)
    if share is None:
        # no live path between the two ports (every uplink down): the RC QP's retries run out
        print("Completion with error at " + ("server" if is_server else "client"), file=err)
        print("Failed status 12: wr_id 0 syndrom 0x81", file=err)
        print(" Failed to complete run_iter_bw function successfully", file=err)
        return 1
    print("\n".join(result_rows(local, remote, eff, run, share)), file=out)
    print(DASHES, file=out, flush=True)
    return 0


def _share(conn: socket.socket, is_server: bool, client: dict[str, Any], server: dict[str, Any],
           opts: Options) -> float | None:
    """The flow's fair share of the fabric (Gb/s, one direction): the client works it out and tells the server.

    ``-b`` runs both directions at once; the share is then their mean (the rows double it).
    """
    if is_server:
        conn.settimeout(_float_env("PROVISIONER_LAB_FLOW_WAIT_S", 10.0) * 3 + 10)
        value = _recv(conn).get("share")
        return float(value) if isinstance(value, int | float) else None
    root = common.lab_root()
    src = (str(client.get("host")), str(client.get("device")), int(client.get("ib_port", 1)))
    dst = (str(server.get("host")), str(server.get("device")), int(server.get("ib_port", 1)))
    pairs = [(src, dst), (dst, src)] if opts.bidirectional else [(src, dst)]
    fid = f"{src[0]}-{os.getpid()}-{opts.tcp_port}"
    try:
        rates = fabric.fair_share(root, fid, pairs)
        share = None if any(r is None for r in rates) else sum(float(r or 0) for r in rates) / len(rates)
        _send(conn, {"share": share})
    finally:
        fabric.unregister(root, fid)
    return share


def _float_env(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, "") or default)
    except ValueError:
        return default


def _adopt(opts: Options, client: dict[str, Any]) -> Options:
    """The server runs with the client's size/iteration parameters (perftest syncs them)."""
    return Options(
        tool=opts.tool,
        device=opts.device,
        ib_port=opts.ib_port,
        gid_index=opts.gid_index,
        size=int(client.get("size", opts.size)),
        all_sizes=bool(client.get("all", opts.all_sizes)),
        iters=int(client.get("iters", opts.iters)),
        report_gbits=opts.report_gbits,
        bidirectional=bool(client.get("bidirectional", opts.bidirectional)),
        duration=client.get("duration", opts.duration),
        use_cuda=opts.use_cuda,
        use_cuda_dmabuf=opts.use_cuda_dmabuf,
        tcp_port=opts.tcp_port,
        qps=int(client.get("qps", opts.qps)),
        host=None,
    )


def main(argv: Sequence[str], build: dict[str, Any] | None = None) -> int:
    """Script entry: the tool name comes from argv[0] (one script, three names); ``build`` from the script."""
    tool = os.path.basename(argv[0]) if argv else "ib_write_bw"
    if tool not in TESTS:
        tool = "ib_write_bw"
    return run(tool, argv[1:], sys.stdout, sys.stderr, Build.from_dict(build))
