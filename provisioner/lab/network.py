"""The lab's own podman network and the route that keeps its traffic on this host.

netavark removes the bridge, and with it the route to the subnet, while no container
is attached; a packet to a lab address would then leave through the default route.
A low-priority ``unreachable`` route for the subnet rejects it instead, and the
bridge's own route (metric 0) wins whenever containers are up.
"""

from __future__ import annotations

import subprocess

from provisioner.errors import LabError
from provisioner.lab.host import podman
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
    """Create the lab network if missing (True when created) and install the fallback route."""
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
