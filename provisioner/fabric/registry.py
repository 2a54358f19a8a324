"""The checks ``provision verify`` knows: one entry per check, in the order a run takes them.

Everything else reads this table: which checks run for a spec (:func:`default_for`), what ``--only`` accepts
(:func:`parse_only`, :data:`NAMES`), the CLI's ``--only`` help and the list of checks under ``provision verify
--help`` (:func:`only_help`, :func:`help_epilog`; docs/cli.md is generated from that help), and the progress line
each check prints when it starts (:func:`progress_label`). :mod:`provisioner.verify` runs the entries in this
order; how each one measures stays in its own module (:attr:`Check.module`).

Kept free of imports beyond the standard library and :mod:`provisioner.errors` so that ``provision --help`` stays
quick: the few rules that read the spec import their fabric module when called.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from provisioner.errors import UsageError

if TYPE_CHECKING:
    from provisioner.spec.cluster import Cluster

Day2 = Literal["", "always", "together", "pair", "sm", "new_hardware"]

Label = str | Callable[["Cluster", str | None], str]
"""A progress line: fixed text, or made from the cluster and the ``--mode`` asked for (None: the spec's)."""


@dataclass(frozen=True)
class Check:
    """One check ``provision verify`` can run (``--only`` name, and ``verify.tests`` name where the spec may list
    it)."""

    name: str
    module: str
    """The module whose pure functions judge it (``provisioner.fabric.*``)."""
    results: tuple[str, ...]
    """The names its results carry in the reports (a check may report several)."""
    help: str
    """What it proves, in a few words (``provision verify --help``)."""
    label: Label
    """The progress line printed when it starts."""
    reread_label: str | None = None
    """The progress line printed when its counters are read again at the end of the run, if it says one."""
    every_node: bool = True
    """It asks every node (so the run first checks that each one answers); False: it asks one node that answers."""
    with_links: bool = False
    """Run by default whenever ``links`` is (the spec cannot list it in ``verify.tests``)."""
    needs: Callable[[Cluster], bool] | None = None
    """Dropped from the default set when this says the spec plans nothing it could check; asked for by name
    (``--only``), it then could not run, for the reason :attr:`lacks` gives (:func:`unmet`)."""
    lacks: str = ""
    """Why it has nothing to check when :attr:`needs` says so ("the spec plans no IPoIB interfaces")."""
    planned: Callable[[Cluster], bool] | None = None
    """Added to the default set when this says the spec plans something it checks, listed or not."""
    day2: Day2 = ""
    """When day 2 runs it on nodes measured against their peers (:func:`provisioner.day2.peers.checks`):
    ``always``; ``together`` (on the nodes and their peers, when a GPU compute node among them has peers and the
    spec lists it); ``pair`` (each GPU compute node with its first peer, the same way); ``sm`` (when the nodes hold
    an SM, after a software change); ``new_hardware`` (on a replaced node, when the spec lists it and plans it
    there); empty: never."""
    traffic: bool = False
    """It loads the fabric or the GPUs (DCGM's diagnostic loads the GPUs): kept off nodes running Slurm jobs
    (:func:`provisioner.verify.verify`'s ``include_busy``)."""


def plans_cabling(cluster: Cluster) -> bool:
    """Whether the spec plans cables a fabric-wide InfiniBand view can check: node ports or links between tiers."""
    from provisioner.fabric import switchlinks

    if cluster.spec.fabric.type != "infiniband":
        return False  # iblinkinfo sees an InfiniBand fabric only
    return bool(cluster.cables) or bool(switchlinks.plan(cluster))


def _has_mounts(cluster: Cluster) -> bool:
    from provisioner.fabric import storage

    return bool(storage.expected_mounts(cluster))


def _has_ipoib(cluster: Cluster) -> bool:
    return bool(cluster.ipoib)


def _has_infiniband(cluster: Cluster) -> bool:
    """An InfiniBand port anywhere: only then is there a subnet manager to ask (Ethernet/RoCE has none)."""
    return any(p.link_layer == "infiniband" for n in cluster.nodes for p in n.ports)


def _has_gpu_nodes(cluster: Cluster) -> bool:
    from provisioner.fabric import gpudirect

    return bool(gpudirect.gpu_nodes(cluster))


def _plans_gpudirect(cluster: Cluster) -> bool:
    """GPUDirect is verified: then so is the PCIe path it runs over."""
    return "gpudirect" in cluster.spec.verify.tests


def _has_user(cluster: Cluster) -> bool:
    return cluster.spec.verify.user is not None


def _has_gpus(cluster: Cluster) -> bool:
    return any(n.gpu_count for n in cluster.nodes)


def _installs_dcgm(cluster: Cluster) -> bool:
    """The spec pins software.dcgm: the gpu_stack play then runs the dcgm role (dcgmi, nv-hostengine) on its GPU
    nodes, so the diagnostic belongs to its acceptance without being listed."""
    return cluster.spec.software.dcgm is not None


def _dcgm_label(cluster: Cluster, mode: str | None) -> str:
    nvswitch = any(n.nvswitch and n.gpu_count for n in cluster.nodes)
    return (f"dcgm: dcgmi diag -r {cluster.spec.verify.dcgm.level} on every GPU node"
            + ("; NVSwitch fabric state (nvidia-smi -q)" if nvswitch else ""))


def _bandwidth_label(cluster: Cluster, mode: str | None) -> str:
    return f"bandwidth: ib_write_bw per rail ({mode or cluster.spec.verify.bandwidth.mode} mode)"


def _gpudirect_label(cluster: Cluster, mode: str | None) -> str:
    from provisioner.fabric import gpudirect

    return ("gpudirect: " + ("DMA-BUF" if gpudirect.dmabuf_mode(cluster) else "nvidia_peermem")
            + ", GPU–NIC affinity, Xids in the kernel log, ib_write_bw --use_cuda")


CHECKS: tuple[Check, ...] = (
    Check("links", "provisioner.fabric.links", ("links", "sm_lid"),
          "ports up at the planned rate and width, error counters steady",
          "links: ibstat on every node",
          reread_label="links: port counters again (a port whose link_downed grew during the run fails)",
          day2="always"),
    Check("versions", "provisioner.fabric.versions", ("versions",),
          "driver, CUDA, NCCL, OFED, firmware as pinned, alike in peers",
          "versions: driver, CUDA, NCCL, OFED, firmware", with_links=True, day2="always"),
    Check("pcie", "provisioner.fabric.pcie", ("pcie",),
          "GPU and HCA links at capable width/speed, no ACS redirect",
          "pcie: lspci -vvv on every GPU node (link width/speed, ACS between GPUs and HCAs)",
          needs=_has_gpu_nodes, lacks="the spec plans no GPU compute node with rail ports",
          planned=_plans_gpudirect),
    Check("sm", "provisioner.fabric.sm_verify", ("subnet_manager",),
          "the spec's master SM is master, every planned SM answers",
          "sm: the spec's master SM is master, every planned SM answers (sminfo)", every_node=False,
          with_links=True, needs=_has_infiniband,
          lacks="the spec plans no InfiniBand port, so there is no subnet manager to check", day2="sm"),
    Check("ipoib", "provisioner.fabric.ipoib", ("ipoib",),
          "every planned IPoIB interface up, addressed, a peer answers",
          "ipoib: every planned interface up with its address and MTU, a peer answers over it", needs=_has_ipoib,
          lacks="the spec plans no IPoIB interfaces", day2="new_hardware"),
    Check("cabling", "provisioner.fabric.cabling", ("cabling", "switch_links", "switch_ports"),
          "cables and links between tiers as planned, switch port counters",
          "cabling: iblinkinfo against the spec's cabling and links between tiers; switch port counters",
          every_node=False, planned=plans_cabling, day2="new_hardware"),
    Check("dcgm", "provisioner.fabric.dcgm", ("dcgm", "nvswitch_fabric"),
          "dcgmi diag on every GPU node, the NVSwitch fabric trained",
          _dcgm_label, needs=_has_gpus, lacks="the spec plans no GPUs", planned=_installs_dcgm, traffic=True),
    Check("bandwidth", "provisioner.fabric.bandwidth", ("bandwidth", "fabric_load"),
          "ib_write_bw per rail between pairs, then every port at once",
          _bandwidth_label, traffic=True, day2="together"),
    Check("gpudirect", "provisioner.fabric.gpudirect", ("gpudirect", "gpudirect_bandwidth", "xid"),
          "GPUDirect RDMA, GPU–NIC affinity, ib_write_bw --use_cuda, Xids",
          _gpudirect_label, traffic=True, day2="pair"),
    Check("nccl", "provisioner.fabric.nccl", ("nccl", "nccl_node", "nccl_container"),
          "all_reduce_perf in each GPU node (NVLink), then across the nodes",
          "nccl: all_reduce_perf in each GPU node with the network disabled (NVLink/NVSwitch), then across the "
          "compute nodes", traffic=True, day2="together"),
    Check("memlock", "provisioner.fabric.memlock", ("memlock",),
          "jobs of verify.user may lock unlimited memory (RDMA registration)",
          "memlock: the locked-memory limit a job of verify.user gets on each GPU node (srun, else runuser)",
          needs=_has_user, lacks="the spec names no verify.user to run as", planned=_has_user),
    Check("storage", "provisioner.fabric.storage",
          ("storage", "storage_roundtrip", "storage_throughput", "storage_export"),
          "NFS/Lustre mounts, a file round trip, the exports",
          "storage: mounts, a file round trip, the exports (user space where no kernel client)", needs=_has_mounts,
          lacks="the spec lists no NFS or Lustre mounts"),
)

NAMES: tuple[str, ...] = tuple(c.name for c in CHECKS)
BY_NAME: dict[str, Check] = {c.name: c for c in CHECKS}


def parse_only(names: Iterable[str]) -> list[str]:
    """``--only``: the named checks in run order; a name not in :data:`CHECKS`, or no name at all (``--only ,``),
    is a usage error naming them all (a run that checked nothing must not pass)."""
    chosen = [t.strip() for t in names if t.strip()]
    if not chosen:
        raise UsageError("--only names no check", hint=f"choose from {', '.join(NAMES)}")
    unknown = sorted(set(chosen) - set(NAMES))
    if unknown:
        raise UsageError(f"unknown test(s): {', '.join(unknown)}", hint=f"choose from {', '.join(NAMES)}")
    return [t for t in NAMES if t in chosen]


def default_for(cluster: Cluster) -> list[str]:
    """The checks a run without ``--only`` takes: the spec's ``verify.tests``, those that go with ``links``, those
    the spec plans for, less those it gives nothing to check; in run order."""
    wanted = set(cluster.spec.verify.tests)

    def chosen(c: Check) -> bool:
        asked = c.name in wanted or (c.with_links and "links" in wanted) or (c.planned is not None
                                                                             and c.planned(cluster))
        return asked and unmet(c, cluster) is None

    return [c.name for c in CHECKS if chosen(c)]


def unmet(check: Check, cluster: Cluster) -> str | None:
    """Why ``check`` has nothing to check in this spec (its :attr:`Check.lacks`); None when it has."""
    return check.lacks if check.needs is not None and not check.needs(cluster) else None


def emptied(cluster: Cluster) -> list[tuple[str, str]]:
    """The checks the spec's ``verify.tests`` lists that :func:`default_for` drops, with why: what a run that
    is left with nothing to check reports as could not run."""
    return [(c.name, why) for c in CHECKS
            if c.name in cluster.spec.verify.tests and (why := unmet(c, cluster)) is not None]


def progress_label(check: Check, cluster: Cluster, mode: str | None) -> str:
    """The line ``verify`` prints when ``check`` starts."""
    return check.label if isinstance(check.label, str) else check.label(cluster, mode)


def only_help() -> str:
    """The help of ``provision verify --only``."""
    return (f"Comma list of checks: {', '.join(NAMES)} (default: the spec's verify.tests; versions and sm go "
            "with links).")


def help_epilog() -> str:
    """The list of checks under ``provision verify --help`` (``\\b``: click prints the lines as they are)."""
    width = max(len(n) for n in NAMES)
    lines = [f"  {c.name:<{width}}  {c.help}" for c in CHECKS]
    return "\b\nChecks (--only), in the order a run takes them:\n" + "\n".join(lines)
