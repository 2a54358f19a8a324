"""Slurm per OS: which Slurm release a node gets, which cgroup plugin that release can run, and what the slurm
role writes for it (cgroup.conf, the v1 boot parameters). One home for these facts; the SLURM-CGROUP rule and the
inventory read them from here.

The OS's own Slurm (``slurm-wlm``), from the distributions' package pages:
  - Ubuntu 22.04 (jammy): 21.08.5-2ubuntu1 (manpages.ubuntu.com/manpages/jammy/man5/slurm.conf.5.html, "Provided by:
    slurm-client_21.08.5-2ubuntu1"; packages.ubuntu.com/jammy/slurm-wlm);
  - Debian 12 (bookworm): 22.05.8-4+deb12u3 (packages.debian.org/bookworm/slurm-wlm; the lab's apt cache holds
    libslurm38_22.05.8-4+deb12u3);
  - Ubuntu 24.04 (noble): 23.11.4 as recalled, not confirmed from a public page here; it lies between lunar's
    22.05.8-3 (23.04) and oracular's 24.05.2-1 (24.10), both from manpages.ubuntu.com "Provided by:" lines, so
    it has cgroup/v2 whichever it is.
cgroup v2 needs the cgroup/v2 plugin, new in Slurm 22.05 (slurm.schedmd.com/cgroup_v2.html; cgroup.conf(5)
CgroupPlugin=<cgroup/v1|cgroup/v2|autodetect|disabled>); 21.08 has cgroup/v1 only, and every supported OS boots the
unified (v2-only) hierarchy by default, so slurmd with proctrack/cgroup does not start there. The two ways out:
a newer Slurm from a site repository (slurm.repository + slurm.version), or booting the nodes with cgroup v1
(systemd.unified_cgroup_hierarchy=0 on the kernel command line; a reboot). CgroupAutomount= is a cgroup/v1
setting, ignored under v2 from 23.02 and gone from cgroup.conf(5) in 24.05 (manpages.ubuntu.com mantic 23.02.3 /
oracular 24.05.2), so it is written only for v1 before 24.05.
"""

from __future__ import annotations

from provisioner.spec.cluster import Cluster
from provisioner.spec.rules import Reporter, Rule, rule

OS_SLURM: dict[str, tuple[int, int]] = {"ubuntu-22.04": (21, 8), "debian-12": (22, 5), "ubuntu-24.04": (23, 11)}
CGROUP_V2_FROM = (22, 5)
AUTOMOUNT_BEFORE = (24, 5)
V1_BOOT_PARAMETERS = ("systemd.unified_cgroup_hierarchy=0",)
"""Kernel command line words that boot systemd with the legacy (v1) cgroup hierarchy (systemd.unified_cgroup_hierarchy
in systemd(1), kernel-command-line(7)). systemd 256 and later refuse v1; every supported OS ships an older one
(Ubuntu 22.04: 249, Debian 12: 252, Ubuntu 24.04: 255)."""


def release(text: str) -> tuple[int, int]:
    major, minor = text.split(".")[:2]
    return int(major), int(minor)


def slurm_release(cluster: Cluster) -> tuple[int, int]:
    """The Slurm release the nodes get: the site repository's when the spec names one, else the OS's."""
    slurm = cluster.spec.slurm
    if slurm is not None and slurm.repository is not None and slurm.version is not None:
        return release(slurm.version)
    return OS_SLURM[cluster.spec.cluster.os]


def cgroup_plugin(cluster: Cluster) -> str:
    """CgroupPlugin= of cgroup.conf: the spec's cgroup version, never autodetect (a node booted otherwise then
    fails at slurmd's start, naming the plugin, instead of running under a hierarchy nobody chose)."""
    slurm = cluster.spec.slurm
    return f"cgroup/{slurm.cgroup if slurm is not None else 'v2'}"


def cgroup_conf(cluster: Cluster) -> list[str]:
    """The settings lines of cgroup.conf for the spec's Slurm release and cgroup version."""
    plugin = cgroup_plugin(cluster)
    lines = [f"CgroupPlugin={plugin}"]
    if plugin == "cgroup/v1" and slurm_release(cluster) < AUTOMOUNT_BEFORE:
        lines.append("CgroupAutomount=yes")
    lines += ["ConstrainCores=yes", "ConstrainDevices=yes", "ConstrainRAMSpace=yes"]
    return lines


def boot_parameters(cluster: Cluster) -> list[str]:
    """Kernel command line words the Slurm nodes must boot with (cgroup v1), none for v2."""
    slurm = cluster.spec.slurm
    return list(V1_BOOT_PARAMETERS) if slurm is not None and slurm.cgroup == "v1" else []


def fmt(ver: tuple[int, int]) -> str:
    return f"{ver[0]}.{ver[1]:02d}"


@rule("SLURM-CGROUP", "error",
      "slurmd with proctrack/cgroup or task/cgroup starts only under a cgroup hierarchy its Slurm has a plugin for: "
      "cgroup v2 needs Slurm >= 22.05, and Ubuntu 22.04 ships 21.08 while booting cgroup v2.")
def _slurm_cgroup(c: Cluster, rep: Reporter, r: Rule) -> None:
    slurm = c.spec.slurm
    if slurm is None:
        return
    if (slurm.repository is None) != (slurm.version is None):
        missing = "version" if slurm.version is None else "repository"
        r.report(rep, ("slurm", "repository" if slurm.repository is not None else "version"),
                 f"slurm.repository and slurm.version go together: slurm.{missing} is missing",
                 "name the site repository and the Slurm release it serves (version: \"23.11\")")
        return
    got = slurm_release(c)
    if slurm.cgroup == "v2" and got < CGROUP_V2_FROM:
        where = (f"the site repository's Slurm {fmt(got)}" if slurm.repository is not None
                 else f"{c.spec.cluster.os} ships Slurm {fmt(got)}")
        r.report(rep, ("slurm", "cgroup") if "cgroup" in slurm.model_fields_set else ("slurm",),
                 f"cgroup v2 needs Slurm >= {fmt(CGROUP_V2_FROM)} (cgroup/v2) but {where}: slurmd would not start",
                 "either a newer Slurm from a site repository (slurm.repository: {url, key}, slurm.version: "
                 "\"23.11\"), or cgroup v1 (slurm.cgroup: v1: the nodes reboot with "
                 f"{' '.join(V1_BOOT_PARAMETERS)})")


@rule("SLURM-ACCOUNTING", "error",
      "slurm.conf names the slurmdbd host every slurmctld and command reaches for accounting: it must be a node of "
      "the spec.")
def _slurm_accounting(c: Cluster, rep: Reporter, r: Rule) -> None:
    slurm = c.spec.slurm
    if slurm is None or slurm.accounting is None:
        return
    if slurm.accounting.host not in {n.name for n in c.nodes}:
        r.report(rep, ("slurm", "accounting", "host"), f"slurmdbd host '{slurm.accounting.host}' is not defined",
                 "name a node from nodes: (usually the controller)")
