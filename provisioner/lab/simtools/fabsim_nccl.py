"""Simulated nccl-tests ``all_reduce_perf`` (an MPI build, ``make MPI=1``), stdlib only.

Launch, as the real binary:
- without a launcher (no ``OMPI_COMM_WORLD_SIZE``), one process drives the ``-g`` GPUs of this node;
- under ``mpirun`` (the lab's stand-in Open MPI, :mod:`fabsim_mpi`, or Debian's), or started by
  ``srun --mpi=pmix`` (real Slurm), every rank runs this module on its own node (:func:`layout`).
  nccl-tests gathers the ranks' host names and device lines over MPI; the simulator's
  stand-in for that exchange is the shared lab root: each rank writes a record under
  ``<lab root>/nccl-jobs/<PMIX_NAMESPACE>/`` and world rank 0 waits for all of them, prints the whole
  table, and publishes the exit status the other ranks then exit with.

NCCL settings are read per rank the way NCCL reads them (src/misc/param.cc): the process environment
first, then ``NCCL_CONF_FILE`` (NCCL >= 2.23) or ``~/.nccl.conf`` of the user's passwd home, then
``/etc/nccl.conf``; a file line ``KEY=value`` never overrides a key already set (``setenv(.., 0)``).
``NCCL_IB_HCA`` selects HCA ports as net_ib.cc does (one leading ``^`` then one leading ``=`` for the
whole list; ``dev[:port]`` entries split on commas; prefix match unless ``=``; only Active ports); the
selected rails alone carry the inter-node traffic.  With ``NCCL_DEBUG=INFO`` each rank prints NCCL's
INFO lines for its network choice (``NET/IB : Using [0]mlx5_0:1/IB ... ; OOB ...``), filtered by
``NCCL_DEBUG_SUBSYS`` (default INIT,ENV).

Output follows nccl-tests' ``PRINT`` formats (rows ``%12li  %12li  %8s  %6s  %6i`` then
``  %7s  %6.2f  %6.2f  %5s`` twice; captured runs in aws/aws-k8s-tester PR #503,
coreweave/nccl-tests PR #43, NVIDIA/nccl-tests issue #252).

Bus-bandwidth model (large messages), see docs/lab-hardware-model.md ("Tool models"):
- one node: the catalog's NVLink figure of the GPU model (``nvlink_gbps`` in node.json, written from
  provisioner.spec.catalog) x 0.82, NCCL's ring efficiency on NVLink ("with the protocol overhead (~20%) NCCL can
  get an effective NVLink bandwidth of 370GB/s" of H100's 450, nccl-tests issue #212; 8 x A100 measure 235 of 300);
  NVLink SHARP (~480 GB/s on 8 H100) is not modelled; no NVSwitch: PCIe ~20 GB/s; a GPU of the run with an NVLink
  down (lab fault ``nvlink_down``): the ring crosses PCIe, ~20 GB/s (the simulator's simplification, see
  docs/lab-hardware-model.md); ``nccl_slow`` does not touch this figure;
- several nodes: min over nodes of sum(selected Active rails' rate x bw_factor) / 8 x 0.94
  (NDR 400 Gb/s NIC -> 46-48 GB/s busbw, nccl-tests issues #290/#267), capped by the
  NVLink figure; x 0.5 when any node lacks ``nvidia_peermem`` (no GPUDirect RDMA:
  33 -> 93 GB/s once enabled in NVIDIA/nccl issue #1412, "half" in issue #465); sockets
  (~1.2 GB/s) when a node selects no HCA or sets NCCL_IB_DISABLE=1;
- NCCL_ALGO, NCCL_PROTO, NCCL_IB_QPS_PER_CONNECTION, NCCL_MIN_NCHANNELS and NCCL_NET_GDR_LEVEL are reported
  taken (``NCCL INFO <name> set by environment to <value>``, a period after integers, with the ENV subsystem) and
  change nothing: no public source states their effect on a cluster like the lab's, so `provision tune` in the lab
  proves the mechanism, not an optimum;
- x the lowest ``nccl_factor`` of the run's nodes (lab fault ``nccl_slow``: NCCL slow while perftest reaches line
  rate, NVIDIA/nccl issue #2409);
- latency 12 us (one node) / 20 us (several) added per operation, so small sizes are
  latency-bound as in real runs.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

try:
    from provisioner.lab.simtools import fabsim_common as common
    from provisioner.lab.simtools import labstate
except ImportError:  # inside a node
    import fabsim_common as common  # type: ignore[import-not-found,no-redef]
    import labstate  # type: ignore[import-not-found,no-redef]

NIC_EFFICIENCY = 0.94
NO_GDR_FACTOR = 0.5
SOCKET_BUSBW = 1.2
NVLINK_RING_EFFICIENCY = 0.82
"""NCCL's effective NVLink bandwidth over line rate: 370 of 450 GB/s on H100 (nccl-tests issue #212)."""
PCIE_BUSBW = 20.0
LAT_US = {True: 12.0, False: 20.0}
NCCL_VERSION_FILE = "nccl.version"
"""Marker the stand-in libnccl2 installs in the lab libdir: {"version": "2.21.5", "cuda": "12.4"}."""
MAX_IB_DEVS = 32  # net_ib.cc
TUNE_PARAMS = ("NCCL_ALGO", "NCCL_PROTO", "NCCL_IB_QPS_PER_CONNECTION", "NCCL_MIN_NCHANNELS", "NCCL_NET_GDR_LEVEL")
INT_PARAMS = {"NCCL_IB_QPS_PER_CONNECTION", "NCCL_MIN_NCHANNELS"}
"""NCCL_PARAM integers print "<name> set by environment to <n>." (a period); strings print none (tuning.cc)."""
JOBS_DIR = "nccl-jobs"
WAIT_ENV = "PROVISIONER_LAB_NCCL_WAIT_S"
SYSROOT_ENV = "PROVISIONER_LAB_SYSROOT"
"""Tests only: prefix of /etc/nccl.conf and of the passwd home directory (default: the real root)."""
# NCCL debug sub-systems (src/include/nccl_common.h) and the default mask (src/debug.cc: INIT|ENV).
SUBSYS = {"INIT": 0x1, "COLL": 0x2, "P2P": 0x4, "SHM": 0x8, "NET": 0x10, "GRAPH": 0x20, "TUNING": 0x40,
          "ENV": 0x80, "ALLOC": 0x100, "CALL": 0x200, "PROXY": 0x400, "NVLS": 0x800, "BOOTSTRAP": 0x1000,
          "REG": 0x2000, "ALL": ~0}
DEFAULT_SUBSYS = SUBSYS["INIT"] | SUBSYS["ENV"]
LOG_LEVELS = {"NONE": 0, "VERSION": 1, "WARN": 2, "INFO": 3, "ABORT": 4, "TRACE": 5}


class NcclFailure(Exception):
    """A failure nccl-tests reports (NCCL WARN lines, then ``Test NCCL failure``)."""

    def __init__(self, lines: Sequence[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = list(lines)


@dataclass(frozen=True)
class Options:
    min_bytes: int
    max_bytes: int
    factor: int
    step_bytes: int
    ngpus: int
    iters: int
    warmup: int
    check: int
    graph: int
    agg: int
    json_out: str | None


def parse_size(text: str) -> int:
    """nccl-tests' parsesize: a number with an optional K/M/G suffix (powers of 1024)."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    text = text.strip()
    if text and text[-1].upper() in units:
        return int(float(text[:-1]) * units[text[-1].upper()])
    return int(text)


def parse_args(argv: Sequence[str]) -> Options:
    parser = argparse.ArgumentParser(prog="all_reduce_perf", add_help=False, exit_on_error=False)
    parser.add_argument("-b", "--minbytes", default="32M")
    parser.add_argument("-e", "--maxbytes", default="32M")
    parser.add_argument("-f", "--stepfactor", type=int, default=1)
    parser.add_argument("-i", "--stepbytes", default="1M")
    parser.add_argument("-g", "--ngpus", type=int, default=1)
    parser.add_argument("-t", "--nthreads", type=int, default=1)
    parser.add_argument("-n", "--iters", type=int, default=20)
    parser.add_argument("-w", "--warmup_iters", type=int, default=5)
    parser.add_argument("-m", "--agg_iters", type=int, default=1)
    parser.add_argument("-c", "--check", type=int, default=1)
    parser.add_argument("-G", "--cudagraph", type=int, default=0)
    parser.add_argument("-J", "--output_file")
    for flag in ("-d", "-o", "-r", "-z", "-a", "-p", "-C"):
        parser.add_argument(flag)
    try:
        ns, unknown = parser.parse_known_args(list(argv))
    except argparse.ArgumentError as exc:
        raise NcclFailure([f"all_reduce_perf: {exc}"]) from exc
    if unknown:
        raise NcclFailure([f"all_reduce_perf: invalid option -- '{unknown[0].lstrip('-')}'"])
    return Options(
        parse_size(ns.minbytes),
        parse_size(ns.maxbytes),
        ns.stepfactor,
        parse_size(ns.stepbytes),
        ns.ngpus,
        ns.iters,
        ns.warmup_iters,
        ns.check,
        ns.cudagraph,
        ns.agg_iters,
        ns.output_file,
    )


def sizes(opts: Options) -> list[int]:
    """The sizes nccl-tests visits (rounded down to a multiple of 4 float elements)."""
    out: list[int] = []
    size = max(opts.min_bytes, 4)
    while size <= opts.max_bytes:
        out.append(size // 4 * 4)
        size = size * opts.factor if opts.factor > 1 else size + max(opts.step_bytes, 1)
    return out or [opts.max_bytes // 4 * 4]



def fmt_time(us: float) -> str:
    """nccl-tests' time column: %7.0f from 10 ms, %7.1f from 100 us, else %7.2f."""
    if us >= 10000.0:
        return f"{us:7.0f}"
    if us >= 100.0:
        return f"{us:7.1f}"
    return f"{us:7.2f}"


def table(opts: Options, nranks: int, peak: float, single: bool, run: str) -> tuple[list[str], float]:
    """Rows and the average bus bandwidth (over out-of-place and in-place, as nccl-tests)."""
    rows: list[str] = []
    total, count = 0.0, 0
    factor = 2.0 * (nranks - 1) / nranks if nranks > 0 else 0.0
    wrong = "0" if opts.check else "N/A"
    for size in sizes(opts):
        cells = []
        for place in ("out", "in"):
            algbw_peak = peak / factor if factor else 0.0
            us = LAT_US[single] + (size / (algbw_peak * 1e3) if algbw_peak else 0.0)
            us *= common.jitter(0.01, "nccl", run, size, place)
            algbw = size / us / 1e3
            busbw = algbw * factor
            total += busbw
            count += 1
            cells.append(f"  {fmt_time(us)}  {algbw:6.2f}  {busbw:6.2f}  {wrong:>5s}")
        rows.append(f"{size:12d}  {size // 4:12d}  {'float':>8s}  {'sum':>6s}  {-1:6d}" + "".join(cells))
    return rows, (total / count if count else 0.0)




# ---------------------------------------------------------------- settings, as NCCL reads them


def sysroot_path(path: str) -> str:
    root = os.environ.get(SYSROOT_ENV, "")
    return os.path.join(root, path.lstrip("/")) if root else path


def nccl_release() -> dict[str, str] | None:
    """{"version", "cuda"} of the installed libnccl2 (its lab marker file); None when NCCL is missing."""
    try:
        with open(os.path.join(common.lab_libdir(), NCCL_VERSION_FILE), encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return {"version": str(data.get("version", "")), "cuda": str(data.get("cuda", ""))}


def version_tuple(text: str) -> tuple[int, ...]:
    out = []
    for part in text.split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def conf_lines(text: str) -> list[tuple[str, str]]:
    """``KEY=value`` pairs of an NCCL conf file, parsed as setEnvFile() does.

    Only the trailing newline is cut; the key is everything before the first ``=`` (spaces
    included) and the value everything after it; a line without ``=`` is skipped.  There is no
    comment syntax: ``# a=b`` sets a variable named ``# a``.
    """
    pairs = []
    for line in text.split("\n"):
        if "=" not in line:
            continue
        key, _, value = line.partition("=")
        pairs.append((key[:1023], value[:1023]))
    return pairs


def conf_files(env: Mapping[str, str], version: str) -> list[str]:
    """The files NCCL reads after the environment, in order (src/misc/param.cc initEnv)."""
    files = []
    user = env.get("NCCL_CONF_FILE", "")
    if user and version_tuple(version) >= (2, 23):  # NCCL_CONF_FILE came with 2.23
        files.append(user)
    else:
        try:
            home = pwd.getpwuid(os.getuid()).pw_dir
        except KeyError:
            home = ""
        if home:
            files.append(os.path.join(home, ".nccl.conf"))
    files.append("/etc/nccl.conf")
    return files


def nccl_settings(env: Mapping[str, str], version: str) -> dict[str, str]:
    """Every variable NCCL sees: the environment, then the conf files without overriding (setenv(.., 0))."""
    merged = dict(env)
    for path in conf_files(env, version):
        try:
            with open(sysroot_path(path), encoding="utf-8", errors="replace") as handle:
                text = handle.read()
        except OSError:
            continue
        for key, value in conf_lines(text):
            merged.setdefault(key, value)
    return merged


# ---------------------------------------------------------------- NCCL_IB_HCA


@dataclass(frozen=True)
class HcaFilter:
    """``NCCL_IB_HCA`` parsed as net_ib.cc does: one ``^`` (exclude) then one ``=`` (exact) for the whole list."""

    exclude: bool
    exact: bool
    entries: tuple[tuple[str, int], ...]  # (prefix, port or -1)


def c_atoi(text: str) -> int:
    digits = ""
    for ch in text.lstrip():
        if not ch.isdigit() and not (ch in "+-" and not digits):
            break
        digits += ch
    try:
        return int(digits)
    except ValueError:
        return 0


def parse_hca_filter(value: str | None) -> HcaFilter:
    """net_ib.cc searchNot/searchExact, then parseStringList (NCCL 2.21.5 src/misc/utils.cc).

    ``=mlx5_0:1,=mlx5_1:1`` is *one* exact list whose second entry is the device named ``=mlx5_1``.
    """
    text = value or ""
    exclude = text.startswith("^")
    if exclude:
        text = text[1:]
    exact = text.startswith("=")
    if exact:
        text = text[1:]
    entries = []
    for item in text.split(","):
        name, colon, rest = item.partition(":")
        if not name:
            continue
        port = c_atoi(rest) if colon else -1
        entries.append((name, port))
        if len(entries) >= MAX_IB_DEVS:
            break
    return HcaFilter(exclude, exact, tuple(entries))


def hca_matches(flt: HcaFilter, device: str, port: int) -> bool:
    """matchIfList(...) ^ searchNot: an empty list matches every port."""
    if not flt.entries:
        hit = True
    else:
        hit = any(
            (device == name if flt.exact else device.startswith(name)) and (want == -1 or want == port)
            for name, want in flt.entries
        )
    return hit != flt.exclude


def select_hcas(node: Mapping[str, Any], settings: Mapping[str, str]) -> list[dict[str, Any]]:
    """The HCA ports NCCL uses on ``node``: Active, IB or RoCE, and passing NCCL_IB_HCA (device order)."""
    if settings.get("NCCL_IB_DISABLE", "0").strip() not in ("", "0"):
        return []
    flt = parse_hca_filter(settings.get("NCCL_IB_HCA"))
    chosen = []
    for hca in node.get("hcas", []):
        if not common.port_usable(hca) or str(hca.get("link_layer", "InfiniBand")) not in ("InfiniBand", "Ethernet"):
            continue
        if hca_matches(flt, str(hca["device"]), int(hca.get("port", 1))):
            chosen.append(dict(hca))
        if len(chosen) >= MAX_IB_DEVS:
            break
    return chosen


def rails_netbw(hcas: Sequence[Mapping[str, Any]]) -> float:
    """GB/s the given rails carry for NCCL (sum over rails)."""
    return sum(float(h.get("rate_gbps", 0)) * float(h.get("bw_factor", 1.0)) / 8 * NIC_EFFICIENCY for h in hcas)


def pkey_table(hca: Mapping[str, Any]) -> list[int]:
    """The port's P_Key table (node.json ``pkeys``, else the single ``pkey`` at index 0)."""
    raw = hca.get("pkeys")
    entries = raw if isinstance(raw, list) else [hca.get("pkey", labstate.DEFAULT_PKEY)]
    return [common.guid_int(e) for e in entries]


# ---------------------------------------------------------------- NCCL's debug output


@dataclass(frozen=True)
class Debug:
    level: int
    mask: int

    @classmethod
    def from_settings(cls, settings: Mapping[str, str]) -> Debug:
        level = LOG_LEVELS.get(settings.get("NCCL_DEBUG", "").strip().upper(), 0)
        raw = settings.get("NCCL_DEBUG_SUBSYS")
        if raw is None:
            return cls(level, DEFAULT_SUBSYS)
        invert = raw.startswith("^")
        mask = 0
        for name in (raw[1:] if invert else raw).split(","):
            mask |= SUBSYS.get(name.strip().upper(), 0)
        return cls(level, ~mask if invert else mask)

    def info(self, flags: int) -> bool:
        return self.level >= LOG_LEVELS["INFO"] and bool(flags & self.mask)

    def warn(self) -> bool:
        return self.level >= LOG_LEVELS["WARN"]


@dataclass
class RankInfo:
    """What one rank knows about itself (and writes for rank 0 in an MPI job)."""

    rank: int
    host: str
    local_rank: int
    ngpus: int
    pid: int
    driver: bool
    nccl: dict[str, str] | None
    selected: list[dict[str, Any]]
    ib_disabled: bool
    pkey_index: int
    lines: list[str]  # NCCL INFO/WARN lines this rank printed

    def record(self) -> dict[str, Any]:
        return dict(self.__dict__)


def oob_address(settings: Mapping[str, str], host: str) -> str:
    ifname = (settings.get("NCCL_SOCKET_IFNAME") or "eth0").lstrip("^=").split(",")[0] or "eth0"
    try:
        addr = socket.gethostbyname(host)
    except OSError:
        addr = "127.0.0.1"
    return f"{ifname}:{addr}<0>"


def nccl_lines(info: RankInfo, settings: Mapping[str, str], dbg: Debug, node: Mapping[str, Any]) -> list[str]:
    """The INFO/WARN lines NCCL prints for this rank's network choice (src/transport/net_ib.cc, net_socket.cc)."""
    tid = info.pid + 12
    prefix = f"{info.host}:{info.pid}:{tid} [{info.local_rank * info.ngpus}] NCCL INFO "
    out = []
    if info.rank == 0 and dbg.level >= LOG_LEVELS["VERSION"] and info.nccl:
        out.append(f"NCCL version {info.nccl['version']}+cuda{info.nccl['cuda']}")
    topo = settings.get("NCCL_TOPO_FILE")
    if topo is not None:
        if dbg.info(SUBSYS["ENV"]):
            out.append(prefix + f"NCCL_TOPO_FILE set by environment to {topo}")
        if not os.path.isfile(sysroot_path(topo)) and dbg.warn():
            out.append(f"{info.host}:{info.pid}:{tid} [{info.local_rank * info.ngpus}] graph/xml.cc:392 NCCL WARN"
                       f" Could not open XML topology file {topo} : No such file or directory")
    if dbg.info(SUBSYS["ENV"]):  # the knobs `provision tune` sweeps; taken, not simulated (no effect on busbw)
        out += [prefix + f"{name} set by environment to {settings[name]}{'.' if name in INT_PARAMS else ''}"
                for name in TUNE_PARAMS if name in settings]
    if info.ib_disabled:
        if dbg.info(SUBSYS["ENV"]):
            out.append(prefix + "NCCL_IB_DISABLE set by environment to 1.")
    else:
        hca = settings.get("NCCL_IB_HCA")
        if hca is not None and dbg.info(SUBSYS["NET"] | SUBSYS["ENV"]):
            out.append(prefix + f"NCCL_IB_HCA set to {hca}")
        if dbg.info(SUBSYS["INIT"] | SUBSYS["NET"]):
            if info.selected:
                used = "".join(
                    f" [{i}]{h['device']}:{int(h.get('port', 1))}/"
                    f"{'IB' if h.get('link_layer', 'InfiniBand') == 'InfiniBand' else 'RoCE'}"
                    for i, h in enumerate(info.selected)
                )
                out.append(prefix + f"NET/IB : Using{used} ; OOB {oob_address(settings, info.host)}")
            else:
                out.append(prefix + "NET/IB : No device found.")
    if not info.selected and dbg.info(SUBSYS["INIT"] | SUBSYS["NET"]):
        out.append(prefix + f"NET/Socket : Using [0]{oob_address(settings, info.host)}")
    if dbg.info(SUBSYS["INIT"]):
        out.append(prefix + f"Using network {'IB' if info.selected else 'Socket'}")
    return out


def gather_self(opts: Options, env: Mapping[str, str], rank: int, local_rank: int, root: str, me: str) -> RankInfo:
    """This rank's view: driver and NCCL present, its settings and the HCAs NCCL picks on its node."""
    release = nccl_release()
    settings = nccl_settings(env, release["version"] if release else "0")
    try:
        node = labstate.load_node(root, me)
    except FileNotFoundError:
        node = {"hostname": me, "hcas": [], "gpus": []}
    disabled = settings.get("NCCL_IB_DISABLE", "0").strip() not in ("", "0")
    pkey = c_atoi(settings.get("NCCL_IB_PKEY", "0")) if settings.get("NCCL_IB_PKEY", "").strip() else 0
    info = RankInfo(rank, me, local_rank, opts.ngpus, os.getpid(), common.driver_installed(), release,
                    select_hcas(node, settings), disabled, pkey, [])
    info.lines = nccl_lines(info, settings, Debug.from_settings(settings), node)
    return info


# ---------------------------------------------------------------- the job: one process, or ranks under mpirun


@dataclass(frozen=True)
class Layout:
    rank: int
    size: int
    local_rank: int
    job: str  # "" without a launcher


class DirectLaunchWithoutPmi(Exception):
    """Started by srun as a job step with no PMI for MPI_Init to use (``srun --mpi=none``)."""


def _job_name(env: Mapping[str, str]) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in env.get("PMIX_NAMESPACE", ""))


def layout(env: Mapping[str, str]) -> Layout:
    """This process's place in the job, as MPI_Init of Open MPI 4.1 finds it.

    - under ``mpirun``: Open MPI's OMPI_COMM_WORLD_* (docs.open-mpi.org, tuning-apps/environment-var);
    - started by ``srun --mpi=pmix``: the PMIx server in slurmstepd gives each task PMIX_RANK and the step's
      PMIX_NAMESPACE (``slurm.pmix.<job>.<step>``), Slurm the step's SLURM_STEP_NUM_TASKS and SLURM_LOCALID
      (captured on Debian 12's Slurm, tests/fixtures/slurm/srun_pmix_env.txt);
    - started by srun without PMIx (a job step, SLURM_STEP_ID set, no PMIX_RANK): Open MPI cannot initialise and
      aborts (:data:`NO_PMI_LINES`)."""
    size = c_atoi(env.get("OMPI_COMM_WORLD_SIZE", "0"))
    if size > 0:
        rank = c_atoi(env.get("OMPI_COMM_WORLD_RANK", "0"))
        local = c_atoi(env.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
        return Layout(rank, size, local, _job_name(env) if size > 1 else "")
    if env.get("PMIX_RANK", "").strip() and env.get("PMIX_NAMESPACE", "").strip():
        size = c_atoi(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or "1") or 1
        rank = c_atoi(env["PMIX_RANK"])
        local = c_atoi(env.get("SLURM_LOCALID", "0"))
        return Layout(rank, size, local, _job_name(env) if size > 1 else "")
    if "SLURM_STEP_ID" in env:
        raise DirectLaunchWithoutPmi
    return Layout(0, 1, 0, "")


# Open MPI 4.1's MPI_Init started by srun with no PMI: the ext3x client's error, the help text of
# orte/mca/ess/... ("direct launched using srun"), then the MPI_Init abort (captures: Open MPI 4.1.4 under srun in
# tdhock's "Installing Rmpi on the cluster", 4.1.6's pmix3x_client.c line 111 in HydraGNN scripts/dcc; Debian's
# build uses the external PMIx, component ext3x).
NO_PMI_LINES = (
    "[{host}:{pid}] OPAL ERROR: Unreachable in file ext3x_client.c at line 111",
    "--------------------------------------------------------------------------",
    'The application appears to have been direct launched using "srun",',
    "but OMPI was not built with SLURM's PMI support and therefore cannot",
    "execute. There are several options for building PMI support under",
    "SLURM, depending upon the SLURM version you are using:",
    "",
    "  version 16.05 or later: you can use SLURM's PMIx support. This",
    "  requires that you configure and build SLURM --with-pmix.",
    "",
    "  Versions earlier than 16.05: you must use either SLURM's PMI-1 or",
    "  PMI-2 support. SLURM builds PMI-1 by default, or you can manually",
    "  install PMI-2. You must then build Open MPI using --with-pmi pointing",
    "  to the SLURM PMI library location.",
    "",
    "Please configure as appropriate and try again.",
    "--------------------------------------------------------------------------",
    "*** An error occurred in MPI_Init",
    "*** on a NULL communicator",
    "*** MPI_ERRORS_ARE_FATAL (processes in this communicator will now abort,",
    "***    and potentially your MPI job)",
    "[{host}:{pid}] Local abort before MPI_INIT completed completed successfully, but am not able to aggregate "
    "error messages, and not able to guarantee that all other processes were killed!",
)


def job_dir(root: str, job: str) -> str:
    return os.path.join(root, JOBS_DIR, job)


def wait_s() -> float:
    try:
        return float(os.environ.get(WAIT_ENV, "60"))
    except ValueError:
        return 60.0


def write_record(root: str, job: str, name: str, data: Mapping[str, Any]) -> None:
    directory = job_dir(root, job)
    os.makedirs(directory, exist_ok=True)
    labstate.atomic_write(os.path.join(directory, name), json.dumps(data))


def read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def gather(root: str, job: str, size: int, me: str) -> list[dict[str, Any]]:
    """Rank 0: the records of ranks 1..size-1 (MPI_Gather's stand-in); a rank that aborted fails the job."""
    deadline = time.monotonic() + wait_s()
    directory = job_dir(root, job)
    while True:
        records = [read_json(os.path.join(directory, f"rank{r}.json")) for r in range(1, size)]
        for rec in records:
            if rec is not None and "abort" in rec:
                raise NcclFailure(list(rec.get("lines", [])) or [f"{me}: rank {rec.get('rank')} aborted"])
        if all(rec is not None for rec in records):
            return [rec for rec in records if rec is not None]
        if time.monotonic() > deadline:
            missing = [r for r, rec in enumerate(records, start=1) if rec is None]
            raise NcclFailure([f"{me}: Test NCCL failure common.cu:1005 'remote process exited or there was a"
                               f" network error / ranks {missing} never joined'"])
        time.sleep(0.05)


def sweep_old_jobs(root: str) -> None:
    """Job directories older than an hour are leftovers of killed runs."""
    base = os.path.join(root, JOBS_DIR)
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        path = os.path.join(base, name)
        try:
            if time.time() - os.path.getmtime(path) > 3600:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            continue


def warn_line(rec: Mapping[str, Any], where: str, msg: str) -> str:
    pid = int(rec["pid"])
    return f"{rec['host']}:{pid}:{pid + 17} [{int(rec['local_rank']) * int(rec['ngpus'])}] {where} NCCL WARN {msg}"


def check_ranks(records: list[dict[str, Any]], nodes: Mapping[str, dict[str, Any]], run_key: str, me: str) -> None:
    """Fail the way NCCL and CUDA do: no driver, missing GPUs, unreachable peers, a rail dropping mid-run,
    a P_Key index the port table does not hold or peers in different partitions."""
    hosts = list(dict.fromkeys(str(r["host"]) for r in records))
    multi = len(hosts) > 1
    for rec in records:
        host = str(rec["host"])
        if not rec.get("driver"):
            raise NcclFailure([f"{host}: Test CUDA failure common.cu:892 'CUDA driver version is insufficient"
                               " for CUDA runtime version'"])
        node = nodes[host]
        if not node.get("reachable", True):
            raise NcclFailure([
                f"{me}:{os.getpid()}:{os.getpid()} [0] NCCL WARN socketStartConnect: Connect to {host} failed :"
                " No route to host",
                f"{me}: Test NCCL failure common.cu:1005 'remote process exited or there was a network error / '",
            ])
        present = [g for g in node.get("gpus", []) if g.get("present", True)]
        if (int(rec["local_rank"]) + 1) * int(rec["ngpus"]) > len(present):
            raise NcclFailure([f"{host}: Test CUDA failure common.cu:892 'invalid device ordinal'"])
    if not multi:
        return
    first = records[0]
    partitions: dict[str, tuple[int, bool]] = {}
    for rec in records:
        host = str(rec["host"])
        for hca in rec.get("selected", []):
            table = pkey_table(hca)
            index = int(rec.get("pkey_index", 0))
            key = table[index] if 0 <= index < len(table) else 0
            if key & 0x7FFF == 0:
                raise NcclFailure([
                    "",
                    warn_line(rec, "misc/ibvwrap.cc:187",
                              "Call to ibv_modify_qp failed with error Invalid argument"),
                    f"{host}: Test NCCL failure common.cu:1005 'unhandled system error (run with NCCL_DEBUG=INFO"
                    " for details)'",
                ])
            partitions[f"{host}/{hca['device']}"] = (key & 0x7FFF, bool(key & 0x8000))
            common.record_flap(host, hca, run_key)
            if common.flaps_now(hca, run_key) or _partition_broken(partitions):
                raise NcclFailure([
                    "",
                    warn_line(rec, "transport/net_ib.cc:1696",
                              f"NET/IB : Got completion from peer {first['host']}<{40000 + int(rec['pid']) % 20000}>"
                              f" with error 12, opcode 0, len 0, vendor err 129 (Recv) localGid"
                              f" fe80::{hca.get('port_guid')}"),
                    f"{host}:{rec['pid']}:{int(rec['pid']) + 17} [{rec['local_rank']}] NCCL INFO"
                    " transport/net.cc:1293 -> 6",
                    f"{me}: Test NCCL failure common.cu:1005 'remote process exited or there was a network"
                    " error / NET/IB : Got completion from peer with error 12, opcode 0, len 0, vendor err"
                    " 129 (Recv)'",
                ])


def _partition_broken(partitions: Mapping[str, tuple[int, bool]]) -> bool:
    """Ports in different partitions cannot talk; nor can two limited members of one (IBA 10.9.3)."""
    keys = {k for k, _ in partitions.values()}
    limited = sum(1 for _, full in partitions.values() if not full)
    return len(keys) > 1 or limited > 1


def intra_busbw(node: Mapping[str, Any]) -> float:
    """What the hops between one node's GPUs carry (GB/s of bus bandwidth): NVLink through the NVSwitch at NCCL's
    ring efficiency, PCIe without one, or with a GPU whose NVLink is down (lab fault nvlink_down)."""
    nvlink = float(node.get("nvlink_gbps") or 0.0)
    if not node.get("nvswitch") or not nvlink or node.get("nvlink_down"):
        return PCIE_BUSBW
    return nvlink * NVLINK_RING_EFFICIENCY


def peak_busbw(records: list[dict[str, Any]], nodes: Mapping[str, dict[str, Any]],
               modules: Mapping[str, list[str]]) -> float:
    """Large-message bus bandwidth (GB/s) of the job."""
    hosts = list(dict.fromkeys(str(r["host"]) for r in records))
    intra = min(intra_busbw(nodes[h]) for h in hosts)
    if len(hosts) == 1:
        return intra if sum(int(r["ngpus"]) for r in records) > 1 else 0.0
    per_host: dict[str, list[dict[str, Any]]] = {}
    for rec in records:  # NCCL uses the rails every rank of a node selected (they read the same files)
        per_host.setdefault(str(rec["host"]), list(rec.get("selected", [])))
    if any(not rails for rails in per_host.values()):
        return SOCKET_BUSBW
    net = min(rails_netbw(rails) for rails in per_host.values())
    if any("nvidia_peermem" not in modules.get(h, []) for h in hosts):
        net *= NO_GDR_FACTOR
    # a node whose NCCL is slow with its links healthy (lab fault nccl_slow) holds back every run it is in
    return min(intra, net) * min(float(nodes[h].get("nccl_factor") or 1.0) for h in hosts)


def header(opts: Options, records: list[dict[str, Any]], nodes: Mapping[str, dict[str, Any]]) -> list[str]:
    step = f"{opts.factor}(factor)" if opts.factor > 1 else f"{opts.step_bytes}(bytes)"
    lines = [
        f"# nThread 1 nGpus {opts.ngpus} minBytes {opts.min_bytes} maxBytes {opts.max_bytes} step: {step}"
        f" warmup iters: {opts.warmup} iters: {opts.iters} agg iters: {opts.agg} validation: {opts.check}"
        f" graph: {opts.graph}",
        "#",
        "# Using devices",
    ]
    for rec in records:
        host = str(rec["host"])
        gpus = [g for g in nodes[host].get("gpus", []) if g.get("present", True)]
        for i in range(int(rec["ngpus"])):
            dev = int(rec["local_rank"]) * int(rec["ngpus"]) + i
            gpu = gpus[dev]
            bus = int(str(gpu.get("pci_bus_id", "0:0:0")).split(":")[1], 16)
            lines.append(
                f"#  Rank {int(rec['rank']) * int(rec['ngpus']) + i:2d} Group  0 Pid {int(rec['pid']):6d} on"
                f" {host:>10s} device {dev:2d} [0x{bus:02x}] {gpu.get('name', '')}"
            )
    return lines


def columns() -> list[str]:
    blank = ""
    return [
        "#",
        f"# {blank:>10s}  {blank:>12s}  {blank:>8s}  {blank:>6s}  {blank:>6s}           out-of-place"
        "                       in-place          ",
        f"# {'size':>10s}  {'count':>12s}  {'type':>8s}  {'redop':>6s}  {'root':>6s}  {'time':>7s}  {'algbw':>6s}"
        f"  {'busbw':>6s} {'#wrong':>6s}  {'time':>7s}  {'algbw':>6s}  {'busbw':>6s} {'#wrong':>6s}",
        f"# {'(B)':>10s}  {'(elements)':>12s}  {blank:>8s}  {blank:>6s}  {blank:>6s}  {'(us)':>7s}  {'(GB/s)':>6s}"
        f"  {'(GB/s)':>6s}  {blank:>5s}  {'(us)':>7s}  {'(GB/s)':>6s}  {'(GB/s)':>6s}  {blank:>5s}",
    ]


def lead(opts: Options, records: list[dict[str, Any]], out: TextIO, me: str) -> None:
    """World rank 0: check the job, print the table."""
    root = common.lab_root()
    nodes: dict[str, dict[str, Any]] = {}
    for host in dict.fromkeys(str(r["host"]) for r in records):
        try:
            nodes[host] = labstate.load_node(root, host)
        except FileNotFoundError as exc:
            raise NcclFailure([f"{me}: Test NCCL failure common.cu:1005 'unhandled system error (run with"
                               f" NCCL_DEBUG=INFO for details) / no such host {host}'"]) from exc
    run_key = common.run_id()
    check_ranks(records, nodes, run_key, me)
    print("\n".join(header(opts, records, nodes)), file=out, flush=True)
    own = records[0].get("lines", [])
    if own:
        print("\n".join(own), file=out, flush=True)
    modules = {h: labstate.load_modules(root, h) for h in nodes}
    peak = peak_busbw(records, nodes, modules)
    nranks = sum(int(r["ngpus"]) for r in records)
    rows, avg = table(opts, nranks, peak, len(nodes) == 1, run_key)
    print("\n".join([*columns(), *rows]), file=out)
    print("# Out of bounds values : 0 OK", file=out)
    print(f"# Avg bus bandwidth    : {avg:g} ", file=out)
    print("#", file=out, flush=True)


def follower(root: str, lay: Layout, info: RankInfo, out: TextIO) -> int:
    """A rank other than 0: hand its record over, print its own NCCL lines, exit as the job does."""
    write_record(root, lay.job, f"rank{lay.rank}.json", info.record())
    if info.lines:
        print("\n".join(info.lines), file=out, flush=True)
    deadline = time.monotonic() + wait_s() + 30
    verdict_path = os.path.join(job_dir(root, lay.job), "verdict.json")
    while time.monotonic() < deadline:
        verdict = read_json(verdict_path)
        if verdict is not None:
            return int(verdict.get("rc", 1))
        time.sleep(0.05)
    return 1


def run(argv: Sequence[str], env: dict[str, str], out: TextIO, err: TextIO) -> int:
    """One process of the job; world rank 0 prints the table."""
    me = common.this_host()
    root = common.lab_root()
    try:
        lay = layout(env)
    except DirectLaunchWithoutPmi:
        print("\n".join(NO_PMI_LINES).replace("{host}", me).replace("{pid}", str(os.getpid())), file=err)
        return 1
    try:
        opts = parse_args(argv)
    except NcclFailure as failure:
        print("\n".join(failure.lines), file=err)
        return 1
    if nccl_release() is None:  # the dynamic loader stops the binary before main()
        print("all_reduce_perf: error while loading shared libraries: libnccl.so.2: cannot open shared object"
              " file: No such file or directory", file=err)
        if lay.job:
            write_record(root, lay.job, f"rank{lay.rank}.json", {"rank": lay.rank, "abort": 127, "lines": [
                f"{me}: all_reduce_perf: error while loading shared libraries: libnccl.so.2"]})
        return 127
    info = gather_self(opts, env, lay.rank, lay.local_rank, root, me)
    if lay.rank != 0:
        return follower(root, lay, info, out)
    rc = 0
    try:
        if lay.job:
            sweep_old_jobs(root)
            records = [info.record(), *gather(root, lay.job, lay.size, me)]
        else:
            records = [info.record()]
        lead(opts, records, out, me)
    except NcclFailure as failure:
        out.flush()
        print("\n".join(failure.lines), file=err)
        rc = 1
    if lay.job:
        write_record(root, lay.job, "verdict.json", {"rc": rc})
    return rc


def main(argv: Sequence[str]) -> int:
    return run(argv[1:], dict(os.environ), sys.stdout, sys.stderr)
