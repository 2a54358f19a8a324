"""The lab's own podman network and the route that keeps its traffic on this host.

netavark removes the bridge, and with it the route to the subnet, while no container
is attached; a packet to a lab address would then leave through the default route.
A low-priority ``unreachable`` route for the subnet rejects it instead, and the
bridge's own route (metric 0) wins whenever containers are up.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from provisioner.errors import LabError
from provisioner.lab.host import host_lock, podman
from provisioner.lab.names import NETWORK, SUBNET

FALLBACK_METRIC = 4000


def fallback_route_args(subnet: str = SUBNET) -> list[str]:
    """``ip route replace unreachable <subnet> metric 4000`` (replace: idempotent)."""
    return ["ip", "route", "replace", "unreachable", subnet, "metric", str(FALLBACK_METRIC)]


def ensure_fallback_route(subnet: str = SUBNET) -> None:
    """Install the unreachable fallback route for the lab subnet."""
    result = subprocess.run(fallback_route_args(subnet), capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise LabError(f"could not add the fallback route for {subnet}: {result.stderr.strip()}")


def has_fallback_route(subnet: str = SUBNET) -> bool:
    """Whether the unreachable fallback route for the subnet is in place."""
    result = subprocess.run(
        ["ip", "route", "show", "type", "unreachable", subnet], capture_output=True, text=True, check=False
    )
    return f"metric {FALLBACK_METRIC}" in result.stdout


def network_subnets(name: str = NETWORK) -> list[str] | None:
    """Subnets of the podman network ``name``, or None when it does not exist."""
    if podman("network", "exists", name, check=False).returncode != 0:
        return None
    out = podman("network", "inspect", "--format", "{{range .Subnets}}{{.Subnet}} {{end}}", name).stdout
    return out.split()


def ensure_network(name: str = NETWORK, subnet: str = SUBNET) -> bool:
    """Create the lab network if missing (True when created) and install the fallback route (under the host
    lock: two labs starting at once both found it missing, and the second's create failed)."""
    with host_lock("lab network"):
        subnets = network_subnets(name)
        created = False
        if subnets is None:
            podman("network", "create", "--subnet", subnet, name)
            created = True
        elif subnet not in subnets:
            raise LabError(
                f"podman network {name} exists with subnet {' '.join(subnets) or 'none'}, not {subnet}",
                hint=f"remove it: podman network rm {name}",
            )
        ensure_fallback_route(subnet)
    return created


def remove_network_if_unused(name: str = NETWORK) -> bool:
    """Remove the lab network when no container uses it any more (True when removed).

    The fallback route stays: it is harmless and keeps the subnet from ever leaking.
    """
    users = podman("ps", "-a", "--filter", f"network={name}", "--format", "{{.Names}}", check=False).stdout
    if users.strip() or podman("network", "exists", name, check=False).returncode != 0:
        return False
    podman("network", "rm", name)
    return True


REACH_WAIT_S = 60.0
"""How long ``lab up`` waits for every node's sshd to answer on its lab address from this host."""


def flush_neighbours(addresses: Sequence[str]) -> None:
    """Forget this host's ARP entries for ``addresses``.

    A new container takes an address with a new MAC. An entry the host still holds for a container that had
    the address before points at a MAC that no bridge port has any more: packets to the new node are dropped
    until the kernel's neighbour probes give up (5 s delay + 3 unicast probes), which is as long as an SSH
    connect timeout. Flushing makes the first packet ask ARP afresh."""
    for ip in addresses:
        subprocess.run(["ip", "neigh", "flush", "to", ip], capture_output=True, text=True, check=False)


def ssh_banner(ip: str, port: int = 22, timeout: float = 3.0) -> str | None:
    """The SSH identification line the node sends on connect, or None when nothing answers in time."""
    try:
        with socket.create_connection((ip, port), timeout=timeout) as conn:
            conn.settimeout(timeout)
            data = conn.recv(256)
    except OSError:
        return None
    line = data.decode("ascii", "replace").splitlines()[0] if data else ""
    return line if line.startswith("SSH-") else None


def diagnose(ip: str) -> str:
    """What this host knows about the path to ``ip`` (route and ARP entry), for an error message."""
    route = subprocess.run(["ip", "route", "get", ip], capture_output=True, text=True, check=False)
    neigh = subprocess.run(["ip", "neigh", "show", "to", ip], capture_output=True, text=True, check=False)
    first = (route.stdout or route.stderr).strip().splitlines()[:1]
    return f"route: {first[0] if first else 'none'}; arp: {neigh.stdout.strip() or 'no entry'}"


def wait_for_ssh(addresses: Mapping[str, str], budget_s: float = REACH_WAIT_S,
                 probe: Callable[[str], str | None] = ssh_banner, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> dict[str, str]:
    """Wait until every node's sshd answers on its address; returns ``{host: why}`` for those that never did.

    ``lab up`` waits for sshd inside each container over ``podman exec``; this checks the path the product
    uses (this host -> the bridge -> the node), so a lab that is "up" can also be reached."""
    pending = dict(addresses)
    deadline = clock() + budget_s
    while pending:
        with ThreadPoolExecutor(max_workers=max(1, min(8, len(pending)))) as pool:
            answers = dict(zip(pending, pool.map(probe, pending.values()), strict=True))
        pending = {h: ip for h, ip in pending.items() if answers[h] is None}
        if not pending or clock() >= deadline:
            break
        sleep(1.0)
    return {h: f"{ip}:22 gave no SSH banner within {budget_s:g} s ({diagnose(ip)})" for h, ip in pending.items()}
