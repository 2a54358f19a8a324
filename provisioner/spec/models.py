"""The cluster spec as an operator writes it (`cluster.yaml`), as pydantic models.

Field names are the YAML keys. Every string that can reach a command line on a node is constrained by a strict
pattern here, so nothing downstream needs to quote defensively. Defaults are what an experienced operator would
pick, so the common case stays short (see examples/).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from provisioner.spec.reserved import ReservedName, why_reserved

# --- constrained strings ---------------------------------------------------------------------------------------
#: The patterns other modules check values against before they become spec text (discover's draft).
HOST_NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
DEVICE_NAME_PATTERN = r"^[A-Za-z0-9_]{1,32}$"
VERSION_PATTERN = r"^[0-9][0-9A-Za-z.+~-]{0,63}$"
HostName = Annotated[str, StringConstraints(pattern=HOST_NAME_PATTERN)]
HostlistExpr = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9\[\],._-]*$", max_length=512)]
ClusterName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")]
ProfileName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,40}$")]
DeviceExpr = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_]+(\[[0-9,-]+\])?$", max_length=40)]
NetDev = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:-]{1,15}$")]
NetDevExpr = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:\[\],-]{1,256}$")]
NcclName = Annotated[str, StringConstraints(pattern=r"^NCCL_[A-Z0-9_]{1,60}$")]
NcclValue = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.,:=^+-]{1,256}$")]
Cidr = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,3}(\.[0-9]{1,3}){3}/[0-9]{1,2}$")]
DeviceName = Annotated[str, StringConstraints(pattern=DEVICE_NAME_PATTERN)]
IpoibName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_-]{0,31}$")]
UnixUser = Annotated[str, StringConstraints(pattern=r"^[a-z_][a-z0-9_-]{0,31}$")]
def _no_parent_dir(value: str) -> str:
    """A path (or URL, or option) that reaches a node never climbs out of where it says it is."""
    if re.search(r"(^|[/=])\.\.(/|$)", value):
        raise ValueError(f"'..' is not allowed in a path that reaches a node: {value!r}")
    return value


NodeSafe = AfterValidator(_no_parent_dir)
LocalPath = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._/~@+-]+$", max_length=1024)]
AbsPath = Annotated[str, StringConstraints(pattern=r"^/[A-Za-z0-9._/@+-]*$", max_length=1024), NodeSafe]
Version = Annotated[str, StringConstraints(pattern=VERSION_PATTERN)]
Url = Annotated[
    str, StringConstraints(pattern=r"^(https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?|file://)(/[A-Za-z0-9._~/%+-]*)?$"),
    NodeSafe,
]
Guid = Annotated[str, StringConstraints(pattern=r"^0x[0-9a-fA-F]{16}$")]
PciAddr = Annotated[str, StringConstraints(pattern=r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")]
MountOption = Annotated[str, StringConstraints(pattern=r"^[a-z0-9_]+(=[A-Za-z0-9_.:/+-]+)?$"), NodeSafe]
ExportOption = Annotated[str, StringConstraints(pattern=r"^[a-z0-9_]+(=[A-Za-z0-9_.:/+-]+)?$"), NodeSafe]
LnetNet = Annotated[str, StringConstraints(pattern=r"^(o2ib|tcp)[0-9]{0,2}(\([A-Za-z0-9_.-]{1,15}\))?$")]
Nid = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,3}(\.[0-9]{1,3}){3}@(o2ib|tcp)[0-9]{0,2}$")]
FsName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_]{1,8}$")]


def _not_reserved(name: str) -> str:
    why = why_reserved(name)
    if why is not None:
        raise ReservedName(f"site_vars may not set '{name}': {why}")
    return name


SiteVarName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,63}$"), AfterValidator(_not_reserved)]
SiteVarValue = bool | int | Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:/=,+-]{0,256}$"), NodeSafe]
ClientSpec = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9*.\[\],/_-]{1,256}$")]

Role = Literal["compute", "login", "subnet_manager", "nfs_server", "storage", "management"]
RateValue = int | Literal["SDR", "DDR", "QDR", "FDR", "EDR", "HDR100", "HDR", "NDR200", "NDR", "XDR"]


class Strict(BaseModel):
    """Every spec model rejects keys it does not know (the loader turns that into a "did you mean")."""

    model_config = ConfigDict(extra="forbid", strict=False, validate_default=True)


# --- cluster, ssh ----------------------------------------------------------------------------------------------
class ClusterMeta(Strict):
    name: ClusterName = Field(description="Short cluster name; names the state directory and lab containers.")
    os: Literal["ubuntu-22.04", "ubuntu-24.04", "debian-12"] = Field(
        description="The OS every node runs; selects package names and repository paths.")


def _dns_or_ipv4(value: str) -> str:
    """A name made only of digits and dots must be a real IPv4 address (``10.0.0.300`` is neither)."""
    labels = value.split(".")
    if all(label.isdigit() for label in labels) and (len(labels) != 4 or any(int(x) > 255 for x in labels)):
        raise ValueError(f"{value!r} is not an IPv4 address")
    return value


JumpHostName = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}"
                           r"[A-Za-z0-9])?)*$", max_length=253), AfterValidator(_dns_or_ipv4)]
"""A DNS name or IPv4 address: letters, digits, '-' and '.', never a leading '-' (it could not pass for an
option on ssh's command line), no '%', quote, space or '@'."""


class SshJump(Strict):
    host: JumpHostName = Field(description="The bastion's DNS name or IPv4 address. Its host key must be in "
                               "ssh.known_hosts, like the nodes' (under [host]:port when the port is not 22).")
    user: UnixUser | None = Field(None, description="Login user on the bastion; ssh.user if unset.")
    port: int = Field(22, ge=1, le=65535, description="SSH port of the bastion.")


class Ssh(Strict):
    user: UnixUser = Field("root", description="Login user on the nodes (root or a sudoer).")
    key: LocalPath | None = Field(None, description="Private key file on the control node; the agent if unset.")
    known_hosts: LocalPath = Field(
        "known_hosts", description="known_hosts file the run trusts (relative to the spec). Host keys are never "
        "accepted automatically.")
    port: int = Field(22, ge=1, le=65535, description="SSH port on every node.")
    jump: SshJump | None = Field(
        None, description="Bastion (jump host) the nodes are reached through, e.g. {host: bastion.example.com, "
        "user: ops}. It authenticates with ssh.key (or the agent) and its host key is checked against "
        "ssh.known_hosts, never accepted automatically; verification and the converge both go through it.")

    @field_validator("jump", mode="before")
    @classmethod
    def _jump_is_a_mapping(cls, v: object) -> object:
        if isinstance(v, str):
            raise ValueError("write the bastion as a mapping, e.g. {host: bastion.example.com, user: ops, port: 22}")
        return v


# --- hardware profiles -----------------------------------------------------------------------------------------
class Gpu(Strict):
    model: str = Field(description="GPU model, e.g. H100-SXM5-80GB (see the GPU catalog in docs/spec-reference.md).")
    count: int = Field(ge=0, le=16, description="GPUs per node.")
    nvswitch: bool = Field(False, description="True on HGX/DGX boards with NVSwitch (needs fabric manager).")


class Hca(Strict):
    device: DeviceExpr = Field(description="RDMA device name (mlx5_0), or a range mlx5_[0-7] for one rail each.")
    port: int = Field(1, ge=1, le=2, description="HCA port number.")
    rate: RateValue | None = Field(None, description="Expected rate in Gb/s or by name (NDR); the fabric's if unset.")
    width: Literal["1X", "2X", "4X", "8X"] = Field("4X", description="Expected link width.")
    link_layer: Literal["infiniband", "ethernet"] | None = Field(None, description="The fabric's if unset.")
    rail: int | None = Field(None, ge=0, le=31, description="Rail index (HCA i of every node forms rail i).")
    gpu: int | None = Field(None, ge=0, le=15, description="GPU index this HCA serves (nearest on PCIe).")
    numa: int | None = Field(None, ge=0, le=15, description="NUMA node of the HCA.")
    netdev: NetDevExpr | None = Field(
        None, description="IPoIB/RoCE netdev name, e.g. ibp24s0; for a device range one per device, expanded in step "
        "(ibp[24,41]s0 or ibp24s0,ibp41s0).")
    pci: PciAddr | None = Field(None, description="PCI address, checked by preflight when given.")
    purpose: Literal["rail", "storage"] = Field("rail", description="Compute rail or storage/management port.")


class Profile(Strict):
    gpu: Gpu | None = Field(None, description="GPUs of this node type; none for service nodes.")
    hcas: list[Hca] = Field(default_factory=list, description="InfiniBand/RoCE ports of this node type.")
    management_interface: NetDev | None = Field(None, description="Netdev of the management network.")
    storage_interface: NetDev | None = Field(None, description="Netdev used for NFS over TCP, if not management.")
    nccl_topology_file: LocalPath | None = Field(None, description="NCCL topology XML to install (NCCL_TOPO_FILE).")
    nccl_net_gdr_level: Literal["LOC", "PIX", "PXB", "PHB", "SYS"] | None = Field(
        None, description="NCCL_NET_GDR_LEVEL; unset leaves NCCL's choice on NVSwitch boards (PHB on others).")


class NodeGroup(Strict):
    name: HostlistExpr = Field(description="Host name or range, e.g. gpu[001-128].")
    address: HostlistExpr = Field(description="Management address or range, expanded in step with name.")
    profile: ProfileName = Field(description="Name of a profile under `profiles`.")
    roles: list[Role] = Field(default_factory=lambda: list[Role](["compute"]), description="What the nodes do.")
    guids: dict[str, Guid] | None = Field(None, description="Known port GUIDs by device (single node only).")


# --- software and repositories ---------------------------------------------------------------------------------
class Driver(Strict):
    version: Version = Field(description="Full driver version, e.g. 550.90.07; the branch is its first part.")
    kernel_modules: Literal["open", "proprietary"] = Field("open", description="Open or proprietary modules.")

    @property
    def branch(self) -> str:
        return self.version.split(".")[0]


class Ofed(Strict):
    flavor: Literal["doca", "mlnx_ofed", "inbox"] = Field("doca", description="DOCA-OFED, MLNX_OFED or the OS's.")
    version: Version | None = Field(None, description="Pinned version (ofed_info -s); required unless inbox.")


class FirmwarePin(Strict):
    version: Annotated[str, StringConstraints(pattern=r"^[0-9]{1,3}\.[0-9]{1,4}\.[0-9]{1,5}$")] = Field(
        description="Firmware version boards of this PSID must run, as flint/sysfs fw_ver print it (28.39.1002).")
    image: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,199}$")] = Field(
        description="File name of the signed image in the mirror directory (no directories).")


class HcaFirmware(Strict):
    mirror: AbsPath = Field(description="Directory on every node holding the firmware images (the site's mirror, "
                            "e.g. an NFS mount); preflight stops before any flash when a pinned image is missing.")
    pins: dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_]{1,16}$")], FirmwarePin] = Field(
        default_factory=dict, description="Board id (PSID, sysfs board_id) -> the firmware it runs. With pins, "
        "every HCA of a node must have one (else the role stops before flashing). Empty: firmware not managed.")
    mlxconfig: dict[Annotated[str, StringConstraints(pattern=r"^[A-Z][A-Z0-9_]{1,63}$")],
                    bool | int | Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_]{1,32}$")]] = Field(
        default_factory=dict, description="mlxconfig parameters every HCA must have for the next boot, e.g. "
        "ATS_ENABLED, ADVANCED_PCI_SETTINGS (docs/roles.md: what NVIDIA documents for "
        "GPUDirect); true/false are 1/0. Set only where they differ; takes effect after a reboot.")


def _version_not_number(v: object) -> object:
    if isinstance(v, float | int) and not isinstance(v, bool):
        raise ValueError(f"write the version as a quoted string (\"{v}\"): YAML reads it as a number")
    return v


class Software(Strict):
    driver: Driver = Field(description="NVIDIA driver version and kernel module flavour.")
    cuda: Version = Field(description="CUDA toolkit version, e.g. \"12.4.1\" (quote it).")
    nccl: Version = Field(description="NCCL version, e.g. \"2.21.5\".")
    ofed: Ofed = Field(default_factory=lambda: Ofed(flavor="inbox"), description="RDMA stack (DOCA-OFED/MLNX_OFED).")
    fabric_manager: bool | None = Field(None, description="Install nvidia-fabricmanager; default: on NVSwitch nodes.")
    nccl_tests: Version = Field("2.13.10", description="nccl-tests version used by verification.")
    perftest: Version = Field("25.10.0-0.128", description="perftest release the perftest_cuda role builds with CUDA "
                              "(linux-rdma/perftest tag) for the GPUDirect bandwidth check.")
    lustre_client: Version | None = Field(None, description="Lustre client version, when Lustre mounts exist.")
    dcgm: Version | None = Field(None, description="DCGM (datacenter-gpu-manager 3.x, e.g. \"3.3.9\") the dcgm role "
                                 "pins on the GPU nodes; with it verify runs its dcgm check by default (dcgmi diag "
                                 "-r verify.dcgm.level); unset: not installed, and the check runs only when "
                                 "verify.tests lists it.")
    nccl_env: dict[NcclName, NcclValue] = Field(
        default_factory=dict, description="NCCL settings for /etc/nccl.conf on every GPU node, over those the spec "
        "implies (NCCL_IB_HCA, ...): e.g. what `provision tune` measured and recommends.")
    hca_firmware: HcaFirmware | None = Field(None, description="HCA firmware (PSID -> version, image) and mlxconfig "
                                             "pins; unset: firmware is only reported.")
    containers: Containers | None = Field(
        None, description="Containers for Slurm jobs: nvidia-container-toolkit, enroot and pyxis on the GPU nodes of "
        "the Slurm cluster (role containers, slurm phase); unset: none.")

    @field_validator("cuda", "nccl", "nccl_tests", "lustre_client", "dcgm", mode="before")
    @classmethod
    def _no_float_versions(cls, v: object) -> object:
        return _version_not_number(v)


class Repo(Strict):
    url: Url = Field(description="Mirror URL of the repository (http, https or file).")
    key: LocalPath = Field(description="GPG public key file on the control node (for apt signed-by).")
    suite: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._/-]{1,64}$")] | None = Field(
        None, description="Suite/distribution; derived from the OS when unset.")
    components: list[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._-]{1,32}$")]] = Field(
        default_factory=lambda: ["main"], description="Components (flat repositories: [])")


class Repositories(Strict):
    offline: bool = Field(True, description="Air-gapped: install only from the mirrors below, never the internet.")
    cuda: Repo | None = Field(None, description="NVIDIA CUDA repository (driver, CUDA, NCCL, fabric manager).")
    doca: Repo | None = Field(None, description="DOCA-OFED/MLNX_OFED repository.")
    os: Repo | None = Field(None, description="Site mirror of the OS repositories, if any.")


ContainerImage = Annotated[str, StringConstraints(pattern=r"^(/|[A-Za-z0-9])[A-Za-z0-9._/:@#+-]{0,254}$"), NodeSafe]
"""What ``srun --container-image=`` takes: a registry reference in enroot's form (``nvcr.io#nvidia/pytorch:24.05-py3``)
or the absolute path of a squashfs image on the nodes; one argv element, never a leading ``-``."""


class Containers(Strict):
    toolkit: Version = Field(description="nvidia-container-toolkit version (e.g. \"1.17.3\"), installed with "
                             "nvidia-container-toolkit-base, libnvidia-container-tools (nvidia-container-cli, what "
                             "enroot's 98-nvidia.sh hook runs) and libnvidia-container1 at \"<toolkit>-1\" from "
                             "`repository`.")
    repository: Repo = Field(description="Site mirror of NVIDIA's libnvidia-container apt repository "
                             "(nvidia.github.io/libnvidia-container/stable/deb/amd64: a flat repository, suite "
                             "\"/\" and components []).")
    enroot: Version = Field(description="enroot version (e.g. \"3.5.0\"): enroot and enroot+caps \"<enroot>-1\", "
                            "the .debs of NVIDIA/enroot's GitHub release.")
    enroot_mirror: Url = Field(description="Directory of the site mirror holding those release .debs under their "
                               "release names (enroot_<enroot>-1_amd64.deb, enroot+caps_<enroot>-1_amd64.deb).")
    pyxis: Version = Field(description="pyxis version (e.g. \"0.20.0\"), built on every Slurm node against the "
                           "installed Slurm's headers (a SPANK plugin must match the Slurm that loads it).")
    pyxis_source: Url = Field(description="URL of pyxis's source tarball of that version in the site mirror (the "
                              "GitHub archive of tag v<pyxis>, pyxis-<pyxis>/ inside).")
    scratch: AbsPath = Field(description="Node-local NVMe/scratch directory for enroot's image cache and container "
                             "root filesystems (ENROOT_CACHE_PATH, ENROOT_DATA_PATH under it); never shared storage.")
    image: ContainerImage | None = Field(
        None, description="Image verify runs the NCCL check in once more, through `srun --container-image` (pyxis, "
        "enroot): a registry reference in enroot's form (nvcr.io#nvidia/pytorch:24.05-py3) or a squashfs path on "
        "the nodes; it must hold nccl-tests. Unset: no container check.")

    @field_validator("toolkit", "enroot", "pyxis", mode="before")
    @classmethod
    def _no_float_versions(cls, v: object) -> object:
        return _version_not_number(v)


class Reboot(Strict):
    allowed: bool = Field(False, description="Let a run reboot nodes whose driver change needs it (new kernel "
                          "module, nouveau still loaded); false: such a node fails with \"reboot required\".")
    serial: Annotated[int, Field(ge=1)] | Annotated[str, StringConstraints(pattern=r"^[1-9][0-9]?%$")] = Field(
        1, description="Nodes rebooted at once: a count, or a share of the nodes that need it (\"25%\"). Batches "
        "run one after another; a failed batch stops the rest.")

    @field_validator("serial", mode="before")
    @classmethod
    def _no_bool(cls, v: object) -> object:
        if isinstance(v, bool):
            raise ValueError("give a count (2) or a share (\"25%\")")
        return v


# --- node baseline: Secure Boot, time ---------------------------------------------------------------------------
class SecureBoot(Strict):
    mok_key: LocalPath = Field(
        description="Private key (PEM) on the control node that DKMS signs the kernel modules with (the NVIDIA "
        "driver, DOCA-OFED): copied to the nodes mode 0600 and named in DKMS's framework.conf.d; never logged.")
    mok_cert: LocalPath = Field(
        description="Its certificate (DER, what `mokutil --import` takes) on the control node: on a node booted "
        "with Secure Boot, preflight stops unless `mokutil --test-key` says it is already enrolled.")


class Time(Strict):
    servers: list[JumpHostName] = Field(
        min_length=1, description="NTP servers (DNS names or IPv4 addresses) chrony on every node uses, and only "
        "these: e.g. [ntp1.example.com, 10.0.0.1].")


# --- switches --------------------------------------------------------------------------------------------------
class Credentials(Strict):
    file: LocalPath | None = Field(None, description="YAML file with username/password (mode 0600).")
    vault: LocalPath | None = Field(None, description="ansible-vault encrypted YAML with username/password.")
    vault_password_file: LocalPath | None = Field(None, description="File holding the vault password.")

    @model_validator(mode="after")
    def _one_source(self) -> Credentials:
        if (self.file is None) == (self.vault is None):
            raise ValueError("give exactly one of `file` or `vault`")
        return self


class Switch(Strict):
    name: HostlistExpr = Field(description="Switch name or range, e.g. leaf[01-04].")
    address: HostlistExpr | None = Field(None, description="Management address or range (managed switches).")
    tier: Literal["leaf", "spine", "core"] = Field("leaf", description="Fat-tree tier.")
    ports: int = Field(64, ge=1, le=256, description="Port count (NDR QM9700: 64).")
    uplinks: int = Field(0, ge=0, le=256, description="Ports going up a tier (leaves: to spines).")
    uplink_rate: RateValue | None = Field(None, description="Uplink rate; the fabric's if unset.")
    device_type: Literal["mellanox_mlnxos", "cumulus_linux", "nvidia_nvue", "dell_sonic"] | None = Field(
        None, description="netmiko device type; unset for unmanaged switches.")
    credentials: Credentials | None = Field(None, description="Where login credentials come from (never inline).")
    embedded_sm: bool = Field(False, description="Whether the switch's own SM is (to be) enabled.")


# --- fabric ----------------------------------------------------------------------------------------------------
class Cable(Strict):
    nodes: HostlistExpr = Field(description="Nodes whose `hca` port is cabled, in order.")
    hca: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_]{1,32}$")] = Field(description="Device, e.g. mlx5_0.")
    switch: HostName = Field(description="Switch the ports land on.")
    ports: Annotated[str, StringConstraints(pattern=r"^\[?[0-9][0-9,-]*\]?$")] = Field(
        description="Switch ports in the same order as nodes, e.g. 1-16.")


class Topology(Strict):
    kind: Literal["single_switch", "fat_tree", "rail_optimized"] = Field("fat_tree")
    cabling: list[Cable] = Field(default_factory=list, description="Which node port goes to which switch port.")


class SmNode(Strict):
    node: HostName
    priority: int = Field(ge=0, le=15, description="sm_priority: the highest becomes master.")
    device: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_]{1,32}$")] | None = Field(
        None, description="Device whose port the SM binds to; the node's first HCA if unset.")


class SubnetManager(Strict):
    kind: Literal["opensm", "switch", "ufm"] = Field("opensm", description="Host opensm, switch-embedded SM or UFM.")
    build: Literal["nvidia", "upstream"] = Field(
        "nvidia", description="NVIDIA's opensm (DOCA/MLNX_OFED, has ar_* engines) or the distribution's.")
    nodes: list[SmNode] = Field(default_factory=list, description="Host SMs and their priorities.")
    switch: HostName | None = Field(None, description="Switch running the SM when kind is switch.")
    routing_engines: list[Annotated[str, StringConstraints(pattern=r"^[a-z_0-9]{2,16}$")]] | None = Field(
        None, description="routing_engine fallback list; ar_updn with adaptive routing, else the SM's default.")
    adaptive_routing: bool = Field(False, description="Enable adaptive routing (ar_* engines).")
    handover: bool = Field(False, description="A returning higher-priority SM takes mastership back.")


class Partition(Strict):
    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_]{1,32}$")]
    pkey: int = Field(ge=0x0001, le=0xFFFF, description="P_Key, e.g. 0x8001 (0x8000 bit: full member).")
    members: HostlistExpr = Field(description="Member nodes (hostlist).")
    membership: Literal["full", "limited"] | None = Field(None, description="Default: from the P_Key's top bit.")
    ipoib: bool = Field(True, description="Create an IPoIB broadcast group for it.")


class Roce(Strict):
    pfc_priority: int | None = Field(None, ge=0, le=7, description="Priority with PFC enabled (usually 3).")
    ecn: bool | None = Field(None, description="ECN/DCQCN on.")
    dscp: int = Field(26, ge=0, le=63, description="DSCP of RoCE traffic.")
    trust: Literal["dscp", "pcp"] = Field("dscp")
    mtu: int = Field(9000, ge=1500, le=9216, description="Ethernet MTU on RoCE ports.")
    gid_index: int = Field(3, ge=0, le=255, description="GID index for RoCEv2 (NCCL_IB_GID_INDEX).")
    traffic_class: int = Field(106, ge=0, le=255, description="NCCL_IB_TC (DSCP 26 << 2 = 104 + ECN bits).")


class IpoibChild(Strict):
    partition: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_]{1,32}$")] = Field(
        description="Partition (fabric.partitions) whose P_Key the child interface carries (ibp24s0.8001).")
    subnet: Cidr = Field(description="IPv4 subnet of the partition, e.g. 10.31.0.0/24 (one per partition).")
    address: HostlistExpr = Field(description="Addresses in step with nodes, e.g. 10.31.0.[11-18].")
    nodes: HostlistExpr | None = Field(
        None, description="Nodes that get the child; default: the partition's members on the parent network.")
    mode: Literal["datagram", "connected"] | None = Field(None, description="The parent network's if unset.")
    mtu: int | None = Field(None, ge=68, le=65520, description="The parent network's if unset.")


class IpoibNetwork(Strict):
    name: IpoibName = Field(description="Name of the IPoIB network (storage mounts refer to it).")
    rail: int | None = Field(None, ge=0, le=31, description="The port: rail i of every node (give rail or device).")
    device: DeviceName | dict[ProfileName, DeviceName] | None = Field(
        None, description="The port: this device of every node (a storage HCA such as mlx5_8), or one per profile "
        "({hgx: mlx5_8, svc: mlx5_0}).")
    nodes: HostlistExpr | None = Field(
        None, description="Member nodes (hostlist or role); default: every node with that port, in spec order.")
    address: HostlistExpr = Field(description="IPoIB addresses in step with nodes, e.g. 10.30.0.[11-18,2-3].")
    subnet: Cidr = Field(description="IPv4 subnet of the network, e.g. 10.30.0.0/24 (one per rail or port).")
    mode: Literal["datagram", "connected"] = Field(
        "datagram", description="IPoIB mode; ConnectX-4 and later (mlx5) run enhanced IPoIB, datagram only.")
    mtu: int | None = Field(
        None, ge=68, le=65520, description="Interface MTU; default 2044 in datagram mode (a 2048-byte IPoIB group, "
        "opensm's default), 65520 connected. Datagram allows up to 4092 (IB MTU 4096 - 4).")
    children: list[IpoibChild] = Field(
        default_factory=list, description="P_Key child interfaces (ibp24s0.8001) for the spec's partitions.")

    @model_validator(mode="after")
    def _one_port(self) -> IpoibNetwork:
        if (self.rail is None) == (self.device is None):
            raise ValueError("give exactly one of `rail` or `device`")
        return self


class Fabric(Strict):
    type: Literal["infiniband", "roce", "ethernet"] = Field("infiniband")
    rate: RateValue = Field(description="Port rate in Gb/s or by name (HDR, NDR, XDR).")
    topology: Topology = Field(default_factory=lambda: Topology(kind="fat_tree"))
    subnet_manager: SubnetManager | None = Field(None, description="Required on InfiniBand.")
    partitions: list[Partition] = Field(default_factory=list)
    default_partition: Literal["full", "limited"] = Field(
        "full", description="Membership of compute ports in the default partition 0x7fff.")
    roce: Roce | None = Field(None, description="RoCE QoS settings (required when type is roce).")
    ipoib: list[IpoibNetwork] = Field(
        default_factory=list, description="IP over InfiniBand: addresses per rail or port, P_Key child interfaces.")


# --- storage ---------------------------------------------------------------------------------------------------
class NfsExport(Strict):
    server: HostName
    path: AbsPath
    clients: ClientSpec = Field(description="CIDR, host or hostlist allowed to mount.")
    options: list[ExportOption] = Field(default_factory=lambda: ["rw", "sync", "root_squash"])
    implementation: Literal["kernel", "ganesha"] = Field("kernel")


class NfsMount(Strict):
    server: HostName
    export: AbsPath
    mount: AbsPath
    on: HostlistExpr = Field("compute", description="Role name or hostlist of the clients.")
    transport: Literal["tcp", "rdma"] = Field("tcp", description="rdma: NFS over RDMA (proto=rdma,port=20049).")
    version: Literal["3", "4.1", "4.2"] = Field("4.2")
    nconnect: int | None = Field(None, ge=1, le=16)
    options: list[MountOption] = Field(default_factory=list)
    automount: bool = Field(False, description="x-systemd.automount instead of mounting at boot.")
    network: IpoibName | None = Field(
        None, description="fabric.ipoib network to mount over (the server's IPoIB address); rdma: the one the server "
        "and every client are on if unset.")
    owner: UnixUser = "root"
    mode: Annotated[str, StringConstraints(pattern=r"^0?[0-7]{3,4}$")] = "0755"

    @field_validator("version", mode="before")
    @classmethod
    def _version_str(cls, v: object) -> object:
        return str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v


class LustreMount(Strict):
    fsname: FsName
    mgs: list[Nid] = Field(min_length=1, description="MGS NIDs, e.g. 10.1.0.1@o2ib (failover pairs in order).")
    mount: AbsPath
    on: HostlistExpr = Field("compute")
    lnet: list[LnetNet] = Field(
        default_factory=lambda: ["o2ib0"], description="LNet networks; an o2ib network without an interface gets the "
        "client's IPoIB netdev, e.g. o2ib0(ibp24s0).")
    network: IpoibName | None = Field(
        None, description="fabric.ipoib network whose interface o2ib uses; default: the one every client is on.")
    options: list[MountOption] = Field(default_factory=lambda: ["flock"])


class Nfs(Strict):
    exports: list[NfsExport] = Field(default_factory=list)
    mounts: list[NfsMount] = Field(default_factory=list)


class Storage(Strict):
    nfs: Nfs = Field(default_factory=Nfs)
    lustre: list[LustreMount] = Field(default_factory=list)
    min_write_mbps: float | None = Field(None, gt=0, description="Optional throughput floor for the round trip.")


# --- GPUDirect RDMA --------------------------------------------------------------------------------------------
class GpuDirect(Strict):
    mode: Literal["peermem", "dmabuf"] = Field(
        "peermem", description="How the HCAs reach GPU memory: the nvidia_peermem module, or Linux DMA-BUF (open "
        "kernel modules on Turing or newer, kernel >= 5.12, CUDA >= 11.7, NCCL >= 2.13; no nvidia_peermem).")


# --- verification ----------------------------------------------------------------------------------------------
class BandwidthCheck(Strict):
    min_fraction: float = Field(0.9, gt=0, le=1, description="Pass threshold as a fraction of line rate.")
    mode: Literal["quick", "full"] = Field("quick", description="quick: 2 rounds; full: every pair.")
    message_size: int = Field(1048576, ge=2, le=1 << 30, description="ib_write_bw -s (bytes).")
    duration: int = Field(5, ge=1, le=120, description="ib_write_bw -D (seconds).")


class GpuDirectCheck(Strict):
    required: bool = Field(True, description="Fail when GPUDirect RDMA does not work.")
    min_fraction: float = Field(0.8, gt=0, le=1, description="Floor for ib_write_bw --use_cuda vs line rate.")


class NcclCheck(Strict):
    min_busbw_gbps: float | None = Field(None, gt=0, description="Floor for all_reduce_perf bus bandwidth (GB/s); "
                                         "without it the floor is min_fraction of the expected figure.")
    min_fraction: float = Field(0.8, gt=0, le=1, description="Without min_busbw_gbps: the floor as a fraction of the "
                                "bus bandwidth the spec's rails and GPU links allow (docs/verification.md).")
    max_bytes: Annotated[str, StringConstraints(pattern=r"^[0-9]+[KMG]?$")] = "8G"
    min_single_node_busbw_gbps: float | None = Field(
        None, gt=0, description="Floor for the single-node all_reduce_perf on each GPU node (GB/s, network "
        "disabled: NVLink/NVSwitch or PCIe between its GPUs); without it the floor is min_single_node_fraction of "
        "the expected figure.")
    min_single_node_fraction: float = Field(
        0.7, gt=0, le=1, description="Without min_single_node_busbw_gbps: the single-node floor as a fraction of the "
        "NVLink (or PCIe) figure of the node's GPU model (docs/verification.md).")


class DcgmCheck(Strict):
    level: Literal[1, 2, 3] = Field(1, description="dcgmi diag -r LEVEL on every GPU node: 1 (seconds: software "
                                    "and deployment), 2 (about 2 minutes: adds PCIe/NVLink and memory), 3 (about "
                                    "30 minutes: adds the stress tests).")


TestName = Literal["links", "ipoib", "bandwidth", "gpudirect", "nccl", "storage", "cabling", "pcie", "memlock", "dcgm"]


class Verify(Strict):
    tests: list[TestName] = Field(
        default_factory=lambda: list[TestName](["links", "ipoib", "bandwidth", "gpudirect", "nccl", "storage"]),
        description="Which checks `verify` runs.")
    bandwidth: BandwidthCheck = Field(default_factory=BandwidthCheck)
    gpudirect: GpuDirectCheck = Field(default_factory=GpuDirectCheck)
    nccl: NcclCheck = Field(default_factory=NcclCheck)
    user: UnixUser | None = Field(
        None, description="An unprivileged account that runs jobs (it must exist on every GPU node). With it the "
        "memlock check reads the locked-memory limit (`ulimit -l`) a job of that user gets on each GPU node: through "
        "`srun` where Slurm runs the node, else a `runuser` login. Root is exempt from the limit (CAP_IPC_LOCK), so "
        "the other checks, run as root, pass where a user's RDMA job cannot register memory.")
    memlock_min_mib: int | None = Field(
        None, ge=1, description="The least locked memory (MiB) the memlock check accepts; default: unlimited only.")

    @field_validator("user")
    @classmethod
    def _unprivileged(cls, user: str | None) -> str | None:
        if user == "root":
            raise ValueError("verify.user must be an unprivileged account: root is exempt from the memlock limit "
                             "(CAP_IPC_LOCK), so it proves nothing about a user's job")
        return user
    dcgm: DcgmCheck = Field(default_factory=DcgmCheck)


# --- Slurm and spare nodes -------------------------------------------------------------------------------------
SlurmName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,40}$")]
SlurmTime = Annotated[str, StringConstraints(
    pattern=r"^(INFINITE|UNLIMITED|[0-9]{1,5}(-[0-9]{1,2})?(:[0-9]{2}){0,2})$")]


class SlurmPartition(Strict):
    name: SlurmName = Field(description="Partition name (PartitionName=).")
    nodes: HostlistExpr = Field(description="Member nodes: a hostlist or a role name (compute).")
    default: bool = Field(False, description="The partition jobs go to when they name none (Default=YES).")
    max_time: SlurmTime = Field("INFINITE", description="MaxTime= of the partition.")


SlurmRelease = Annotated[str, StringConstraints(pattern=r"^[0-9]{2}\.[0-9]{2}$")]
HealthNodeState = Literal["ALLOC", "ANY", "CYCLE", "IDLE", "MIXED", "NONDRAINED_IDLE"]


class SlurmNhc(Strict):
    repository: Repo = Field(description="Site mirror holding LBNL NHC's Debian package (no supported OS ships "
                             "one): the slurm role installs it from there on every Slurm node.")
    package: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9.+-]{0,63}$")] = Field(
        "lbnl-nhc", description="The package's name in that repository.")
    interval: int = Field(300, ge=10, le=86400, description="HealthCheckInterval= (seconds between two runs of "
                          "/usr/sbin/nhc on each node).")
    node_state: list[HealthNodeState] = Field(
        default_factory=lambda: list[HealthNodeState](["ANY"]), min_length=1,
        description="HealthCheckNodeState=: the node states NHC runs in (CYCLE spreads the runs over the interval).")


class SlurmAccounting(Strict):
    host: HostName = Field(description="The node running slurmdbd (with a local MariaDB it reaches through the "
                           "unix socket, so no database password exists); slurm.conf names it "
                           "(AccountingStorageType=accounting_storage/slurmdbd).")


class Slurm(Strict):
    controller: HostName = Field(description="The node running slurmctld (munge's key is made there).")
    partitions: list[SlurmPartition] = Field(min_length=1, description="Partitions and their nodes; spares are "
                                             "in none of them.")
    gres: bool = Field(True, description="Declare the GPUs as GRES (GresTypes=gpu, Gres=gpu:N, gres.conf with "
                       "AutoDetect=nvml and /dev/nvidia*).")
    version: SlurmRelease | None = Field(
        None, description="The Slurm release (\"23.11\") slurm.repository serves; unset: the OS's own package "
        "(Ubuntu 22.04: 21.08, Debian 12: 22.05, Ubuntu 24.04: 23.11).")
    repository: Repo | None = Field(
        None, description="Site repository with a newer Slurm than the OS ships (give its release in "
        "slurm.version): the way to cgroup v2 on Ubuntu 22.04.")
    cgroup: Literal["v2", "v1"] = Field(
        "v2", description="The cgroup version the nodes run Slurm under. v2 needs Slurm >= 22.05 (cgroup/v2); v1 "
        "boots the nodes with systemd.unified_cgroup_hierarchy=0 (a reboot: `provision plan` shows it as one).")
    accounting: SlurmAccounting | None = Field(None, description="Job accounting through slurmdbd; unset: none.")
    nhc: SlurmNhc | None = Field(
        None, description="LBNL NHC on every Slurm node from a site mirror, with `provision export nhc`'s nhc.conf, "
        "run by slurmd (HealthCheckProgram=/usr/sbin/nhc): a node failing a check is drained with NHC's reason.")


class Spares(Strict):
    nodes: HostlistExpr = Field(description="Spare nodes: converged and verified like the rest, kept out of "
                                "the Slurm partitions until `provision failover` puts one in a failed node's place.")
    failover_budget_s: int = Field(600, ge=60, le=86400, description="Seconds from a failed health check to the "
                                   "spare in the partition that `provision watch` must keep (the reference promises "
                                   "10 minutes).")
    watch_interval_s: int = Field(60, ge=5, le=3600, description="Seconds between two rounds of `provision "
                                  "watch`'s health checks.")


# --- the whole spec --------------------------------------------------------------------------------------------
class Spec(Strict):
    cluster: ClusterMeta = Field(description="Name and OS of the cluster.")
    ssh: Ssh = Field(default_factory=Ssh, description="How the control node logs in to the nodes.")
    software: Software = Field(description="Pinned versions of the GPU and RDMA software stack.")
    repositories: Repositories = Field(default_factory=Repositories, description="Package mirrors and their keys.")
    reboot: Reboot = Field(default_factory=Reboot, description="Whether and how many nodes a run may reboot at once.")
    profiles: dict[ProfileName, Profile] = Field(description="Node types: GPUs, HCAs, interfaces.")
    nodes: list[NodeGroup] = Field(min_length=1, description="Hosts (hostlist ranges), their profile and roles.")
    fabric: Fabric = Field(description="The RDMA fabric: type, rate, topology, subnet manager, partitions.")
    switches: list[Switch] = Field(default_factory=list, description="Fabric switches (topology and management).")
    storage: Storage = Field(default_factory=Storage, description="NFS exports/mounts and Lustre mounts.")
    gpudirect: GpuDirect = Field(default_factory=GpuDirect, description="GPUDirect RDMA: peermem or DMA-BUF.")
    verify: Verify = Field(default_factory=Verify, description="What `provision verify` checks and its thresholds.")
    slurm: Slurm | None = Field(None, description="The Slurm cluster on these nodes (controller, partitions); "
                                "rolling changes and failover drain and resume nodes through it.")
    spares: Spares | None = Field(None, description="Spare nodes and the failover time budget.")
    secure_boot: SecureBoot | None = Field(
        None, description="The Machine Owner Key DKMS signs the kernel modules with, for nodes booted with UEFI "
        "Secure Boot (the kernel refuses unsigned modules there); preflight reads each node's Secure Boot state.")
    time: Time | None = Field(None, description="The NTP servers chrony uses on every node; unset: the nodes' own "
                              "time configuration is left as it is.")
    site_vars: dict[SiteVarName, SiteVarValue] = Field(
        default_factory=dict, description="Site overrides of role tunables (e.g. preflight_gpu_evidence), "
        "rendered into group_vars/all as data (!unsafe); names and string values are pattern-checked, and "
        "ansible_*, provisioner_*, Ansible keywords and every variable the tool renders are refused.")
