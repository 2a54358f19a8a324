"""Push switch plans over SSH with netmiko and read the result back (the package's only netmiko importer).

Host keys are verified, never learned: netmiko runs with `ssh_strict=True` (paramiko's RejectPolicy) and loads
only the known_hosts file the caller names, so an unknown or changed key stops that switch with a message that
says what to do. Every failure becomes one line naming the switch; one switch failing does not stop the others.
The password goes to netmiko and nowhere else: messages are built here, and any foreign text that makes it into
one is scrubbed of the secret first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

from provisioner.errors import ParseError, UsageError
from provisioner.spec.cluster import Cluster
from provisioner.switches.credentials import MASK, SwitchCredentials, load_credentials
from provisioner.switches.plan import PARSERS, SwitchPlan, plan_cluster

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Timeouts:
    """Seconds. `read` bounds each command; `apply` bounds the NVUE apply / MLNX-OS write, which take longer."""

    connect: float = 10.0
    auth: float = 15.0
    banner: float = 15.0
    read: float = 30.0
    apply: float = 120.0


@dataclass(frozen=True)
class CheckResult:
    command: str
    field: str
    want: str
    got: str | None
    ok: bool


@dataclass
class SwitchResult:
    """What happened on one switch. `error` is one line naming the switch; `outputs` keeps each read's text."""

    name: str
    address: str
    ok: bool = False
    pushed: list[str] = field(default_factory=list)
    checks: list[CheckResult] = field(default_factory=list)
    outputs: dict[str, str] = field(default_factory=dict)
    error: str | None = None

    def summary(self) -> str:
        if self.error:
            return self.error
        bad = [c for c in self.checks if not c.ok]
        if bad:
            return f"{self.name}: read-back disagrees: " + "; ".join(
                f"`{c.command}` {c.field} is {c.got!r}, want {c.want!r}" for c in bad)
        return f"{self.name}: ok ({len(self.pushed)} commands, {len(self.checks)} checks)"


class Connection(Protocol):
    """The part of netmiko's BaseConnection this module uses."""

    def enable(self) -> str: ...
    def send_config_set(self, config_commands: list[str], **kw: Any) -> str: ...
    def send_command(self, command_string: str, **kw: Any) -> str: ...
    def save_config(self) -> str: ...
    def disconnect(self) -> None: ...


class SwitchError(Exception):
    """Internal: a failure on one switch, already phrased as one line."""


def connect_params(plan: SwitchPlan, creds: SwitchCredentials, known_hosts: Path, host: str, port: int,
                   timeouts: Timeouts) -> dict[str, Any]:
    """netmiko ConnectHandler arguments: strict host keys from `known_hosts` only, password auth, no agent."""
    return {
        "device_type": plan.netmiko_type,
        "host": host,
        "port": port,
        "username": creds.username,
        "password": creds.password.reveal(),
        "ssh_strict": True,
        "system_host_keys": False,
        "alt_host_keys": True,
        "alt_key_file": str(known_hosts),
        "use_keys": False,
        "allow_agent": False,
        "conn_timeout": timeouts.connect,
        "auth_timeout": timeouts.auth,
        "banner_timeout": timeouts.banner,
        "read_timeout_override": timeouts.read,
    }


def _netmiko_connect(params: dict[str, Any]) -> Connection:
    from netmiko import ConnectHandler

    return cast(Connection, ConnectHandler(**params))


def _scrub(text: str, creds: SwitchCredentials | None) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")[:200]
    if creds is not None and creds.password.reveal():
        line = line.replace(creds.password.reveal(), MASK)
    return line


def explain(exc: BaseException, plan: SwitchPlan, known_hosts: Path, creds: SwitchCredentials | None) -> str:
    """One line naming the switch and what to do, from a netmiko/paramiko/socket failure."""
    who = f"{plan.name} ({plan.address})"
    kind = type(exc).__name__
    text = str(exc)
    if isinstance(exc, SwitchError):
        return text
    if "not found in known_hosts" in text:
        return (f"{who}: host key unknown — not in {known_hosts}; verify the switch's fingerprint and add it "
                "(ssh-keyscan output checked against the console), keys are never accepted automatically")
    if "does not match" in text or "BadHostKey" in kind:
        return f"{who}: host key CHANGED since it was recorded in {known_hosts}; check the switch before trusting it"
    if "Authentication" in kind or "Authentication failed" in text or "Authentication timeout" in text:
        if "timeout" in text.lower():
            return f"{who}: login timed out during authentication (slow switch? raise the auth timeout)"
        src = creds.source if creds else "the credentials"
        return f"{who}: authentication failed — check the username/password in {src}"
    if "Timeout" in kind or isinstance(exc, TimeoutError):
        return f"{who}: timed out ({_scrub(text, creds) or kind}); is the switch reachable on SSH?"
    if isinstance(exc, ConnectionError | OSError):
        return f"{who}: cannot connect ({kind}: {_scrub(text, creds)})"
    return f"{who}: {kind}: {_scrub(text, creds)}"


def _cli_error(output: str, device_type: str) -> str | None:
    """The first error line a CLI printed, if any (MLNX-OS: `% ...`; NVUE/shell: `Error:`/`command not found`)."""
    for line in output.splitlines():
        s = line.strip()
        if device_type == "mellanox_mlnxos" and s.startswith("%"):
            return s
        if device_type != "mellanox_mlnxos" and (s.startswith(("Error", "Invalid")) or "command not found" in s):
            return s
    return None


def _push(conn: Connection, plan: SwitchPlan, result: SwitchResult, timeouts: Timeouts) -> None:
    if plan.device_type == "mellanox_mlnxos":
        conn.enable()
    for block in plan.blocks:
        log.info("%s: %s", plan.name, block.title)
        if block.mode == "config":
            out = conn.send_config_set(list(block.commands), read_timeout=timeouts.read)
            err = _cli_error(out, plan.device_type)
            if err:
                raise SwitchError(f"{plan.name}: switch refused a command in '{block.title}': {err}")
            result.pushed += block.commands
        else:
            for cmd in block.commands:
                out = conn.send_command(cmd, read_timeout=timeouts.read)
                err = _cli_error(out, plan.device_type)
                if err:
                    raise SwitchError(f"{plan.name}: switch refused `{cmd}`: {err}")
                result.pushed.append(cmd)
    if plan.save:
        log.info("%s: %s", plan.name, plan.save)
        if plan.device_type == "mellanox_mlnxos":
            out = conn.save_config()
        else:
            out = conn.send_command(plan.save, read_timeout=timeouts.apply)
        err = _cli_error(out, plan.device_type)
        if err:
            raise SwitchError(f"{plan.name}: `{plan.save}` failed: {err}")


def _read_back(conn: Connection, plan: SwitchPlan, result: SwitchResult, timeouts: Timeouts) -> None:
    for cmd in dict.fromkeys([*plan.reads, *(c.command for c in plan.checks)]):
        result.outputs[cmd] = conn.send_command(cmd, read_timeout=timeouts.read)
    for check in plan.checks:
        try:
            got = PARSERS[check.parser](result.outputs[check.command]).get(check.field)
        except ParseError as exc:
            raise SwitchError(f"{plan.name}: cannot read back `{check.command}`: {exc}") from None
        result.checks.append(CheckResult(check.command, check.field, check.want, got, check.accepts(got)))


def apply_plan(plan: SwitchPlan, creds: SwitchCredentials, known_hosts: Path, *, host: str | None = None,
               port: int = 22, timeouts: Timeouts | None = None,
               connect: Callable[[dict[str, Any]], Connection] = _netmiko_connect) -> SwitchResult:
    """Push one plan and read it back; never raises for a switch-side problem (see `result.error`)."""
    t = timeouts or Timeouts()
    result = SwitchResult(plan.name, plan.address)
    if not plan.apply_supported:
        result.error = f"{plan.name}: --apply does not support {plan.device_type} yet; push the --display text"
        return result
    conn: Connection | None = None
    try:
        conn = connect(connect_params(plan, creds, known_hosts, host or plan.address, port, t))
        _push(conn, plan, result, t)
        _read_back(conn, plan, result, t)
        result.ok = all(c.ok for c in result.checks)
    except Exception as exc:  # every failure on one switch becomes its one-line error
        result.error = explain(exc, plan, known_hosts, creds)
        log.warning("%s", result.error)
    finally:
        if conn is not None:
            try:
                conn.disconnect()
            except Exception:  # a broken session may fail to close; the result already says why
                log.debug("%s: disconnect failed", plan.name)
    return result


def apply(cluster: Cluster, known_hosts: Path, *, only: set[str] | None = None,
          endpoints: Mapping[str, tuple[str, int]] | None = None, port: int = 22,
          timeouts: Timeouts | None = None,
          credentials: Callable[[SwitchPlan], SwitchCredentials] | None = None) -> list[SwitchResult]:
    """Push every managed switch's plan (or those in `only`) and read each back.

    `endpoints` maps a switch name to the (host, port) to dial instead of its spec address (a jump tunnel, the
    lab). Credentials come from the spec (`credentials` overrides the lookup, for tests). Raises UsageError only
    for problems that stop everything (no known_hosts file, unknown names in `only`).
    """
    if not known_hosts.is_file():
        raise UsageError(f"known_hosts file {known_hosts} does not exist",
                         hint="record each switch's host key there after checking its fingerprint")
    plans = plan_cluster(cluster)
    if only is not None:
        missing = only - {p.name for p in plans}
        if missing:
            raise UsageError(f"not managed switches: {', '.join(sorted(missing))}",
                             hint="a managed switch has device_type and address in the spec")
        plans = [p for p in plans if p.name in only]
    base = Path(cluster.file).resolve().parent
    results: list[SwitchResult] = []
    for plan in plans:
        if not plan.blocks:
            results.append(SwitchResult(plan.name, plan.address, ok=True))
            continue
        try:
            creds = credentials(plan) if credentials else _spec_credentials(cluster, plan, base)
        except UsageError as exc:
            results.append(SwitchResult(plan.name, plan.address, error=f"{plan.name}: {exc}"))
            continue
        host, dial_port = (endpoints or {}).get(plan.name, (plan.address, port))
        results.append(apply_plan(plan, creds, known_hosts, host=host, port=dial_port, timeouts=timeouts))
    return results


def _spec_credentials(cluster: Cluster, plan: SwitchPlan, base: Path) -> SwitchCredentials:
    sw = cluster.spec.switches[plan.spec_index]
    if sw.credentials is None:
        raise UsageError("no credentials in the spec", hint="credentials: {file: secrets/switches.yml}")
    return load_credentials(sw.credentials, base)
