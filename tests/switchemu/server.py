"""A paramiko SSH server on 127.0.0.1 (ephemeral port, own thread) that plays a switch CLI.

Two personalities:
* `mlnxos`: prompts `NAME [standalone: master] >` / `#` / `(config) #`, `enable`, `configure terminal`
  (and `config term`), paging off (`no cli session paging enable`, `terminal length 999`), `ib sm`, `no ib sm`,
  `ib smnode NAME sm-priority N`, `configuration write`, `show ib sm`, `show interfaces ib status`, and
  `% Unrecognized command` for anything else.
* `nvue`: a bash-like prompt `cumulus@NAME:mgmt:~$`, `nv set ...` (staged), `nv config apply -y` (applies),
  `nv show qos roce` (rendered from the applied state in NVUE's two-column layout), `command not found` otherwise.

State persists per emulator across connections, so a read-back shows what an earlier session set. Knobs: a
slow shell (`login_delay`), slow authentication (`auth_delay`), commands whose effect is silently dropped
(`ignore`, to make a read-back disagree) and commands that fail (`fail`).
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import paramiko
from paramiko.common import (
    AUTH_FAILED,
    AUTH_SUCCESSFUL,
    OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED,
    OPEN_SUCCEEDED,
)


@dataclass
class EmuSwitch:
    kind: str  # "mlnxos" | "nvue"
    hostname: str
    username: str = "admin"
    password: str = "pw"
    login_delay: float = 0.0
    auth_delay: float = 0.0
    ignore: set[str] = field(default_factory=set)
    fail: set[str] = field(default_factory=set)
    # state
    sm_enabled: bool = True  # MLNX-OS default on a managed switch left as shipped by a previous owner
    sm_priority: int | None = None
    saved: int = 0
    staged: dict[str, str] = field(default_factory=dict)
    applied: dict[str, str] = field(default_factory=dict)
    history: list[str] = field(default_factory=list)
    logins: int = 0
    failed_logins: int = 0


class _Server(paramiko.ServerInterface):
    def __init__(self, sw: EmuSwitch) -> None:
        self.sw = sw
        self.shell = threading.Event()

    def get_allowed_auths(self, username: str) -> str:
        return "password"

    def check_auth_password(self, username: str, password: str) -> int:
        if self.sw.auth_delay:
            time.sleep(self.sw.auth_delay)
        if username == self.sw.username and password == self.sw.password:
            self.sw.logins += 1
            return AUTH_SUCCESSFUL
        self.sw.failed_logins += 1
        return AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return OPEN_SUCCEEDED if kind == "session" else OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_pty_request(self, *args: Any) -> bool:
        return True

    def check_channel_shell_request(self, channel: paramiko.Channel) -> bool:
        self.shell.set()
        return True


class SwitchEmulator:
    """Start with `with SwitchEmulator(EmuSwitch(...)) as emu:`; `emu.port`, `emu.known_hosts_line()`."""

    def __init__(self, sw: EmuSwitch) -> None:
        self.sw = sw
        self.key = paramiko.ECDSAKey.generate()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port: int = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._transports: list[paramiko.Transport] = []
        self._accept = threading.Thread(target=self._serve, daemon=True)

    def known_hosts_line(self) -> str:
        return f"[127.0.0.1]:{self.port} {self.key.get_name()} {self.key.get_base64()}\n"

    def __enter__(self) -> SwitchEmulator:
        self._accept.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._accept.join(timeout=5)
        for t in self._transports:
            t.close()
        for th in self._threads:
            th.join(timeout=5)
        self.sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            th = threading.Thread(target=self._session, args=(client,), daemon=True)
            self._threads.append(th)
            th.start()

    def _session(self, client: socket.socket) -> None:
        transport = paramiko.Transport(client)
        self._transports.append(transport)
        transport.add_server_key(self.key)
        server = _Server(self.sw)
        try:
            transport.start_server(server=server)
        except (paramiko.SSHException, EOFError, OSError):
            return
        chan = None
        deadline = time.monotonic() + 10
        while chan is None and transport.is_active() and not self._stop.is_set() and time.monotonic() < deadline:
            chan = transport.accept(timeout=0.2)
        if chan is None or not server.shell.wait(timeout=10):
            transport.close()
            return
        try:
            Shell(self.sw, chan).run(self._stop)
        except (OSError, EOFError, paramiko.SSHException):
            pass
        finally:
            with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
                chan.close()  # the client may have hung up first
            transport.close()


class Shell:
    """One interactive session: echo input, run each line, print the prompt of the current mode."""

    def __init__(self, sw: EmuSwitch, chan: paramiko.Channel) -> None:
        self.sw = sw
        self.chan = chan
        self.mode = "exec"
        self.closed = False

    def prompt(self) -> str:
        if self.sw.kind == "nvue":
            return f"cumulus@{self.sw.hostname}:mgmt:~$ "
        base = f"{self.sw.hostname} [standalone: master] "
        return base + {"exec": "> ", "enable": "# ", "config": "(config) # "}[self.mode]

    def send(self, text: str) -> None:
        self.chan.sendall(text.replace("\r\n", "\n").replace("\n", "\r\n").encode())

    def run(self, stop: threading.Event) -> None:
        if self.sw.login_delay:
            time.sleep(self.sw.login_delay)
        if self.sw.kind == "mlnxos":
            self.send("\nNVIDIA MLNX-OS Switch Management (emulated)\n\n")
        self.send(self.prompt())
        self.chan.settimeout(0.2)
        buf = ""
        while not stop.is_set() and not self.closed:
            try:
                data = self.chan.recv(1024)
            except TimeoutError:
                continue
            if not data:
                return
            for ch in data.decode(errors="replace"):
                if ch in "\r\n":
                    if ch == "\n" and buf == "" and getattr(self, "_last_cr", False):
                        self._last_cr = False
                        continue
                    self._last_cr = ch == "\r"
                    self.send("\n")
                    out = self.execute(buf.strip())
                    buf = ""
                    if self.closed:
                        return
                    self.send(out + self.prompt())
                else:
                    self._last_cr = False
                    buf += ch
                    self.send(ch)

    def execute(self, line: str) -> str:
        if not line:
            return ""
        self.sw.history.append(line)
        if line in self.sw.fail:
            return self._error(line)
        return self._mlnxos(line) if self.sw.kind == "mlnxos" else self._nvue(line)

    def _error(self, line: str) -> str:
        if self.sw.kind == "mlnxos":
            return f'% Unrecognized command "{line.split()[0]}".\nType "?" for help.\n'
        return f"Error: Invalid config: {line}\n"

    # --- MLNX-OS ---------------------------------------------------------------------------------------------
    def _mlnxos(self, line: str) -> str:
        words = line.split()
        if line in ("no cli session paging enable", "terminal length 999", "terminal length 0",
                    "terminal width 511"):
            return ""
        if line == "enable":
            if self.mode == "exec":
                self.mode = "enable"
            return ""
        if line in ("configure terminal", "config term", "conf t", "config terminal"):
            if self.mode == "exec":
                return '% Unrecognized command "configure".\nType "?" for help.\n'
            self.mode = "config"
            return ""
        if line == "exit":
            if self.mode == "config":
                self.mode = "enable"
                return ""
            self.closed = True
            return ""
        if line == "show ib sm":
            return ("enable" if self.sw.sm_enabled else "disable") + "\n"
        if line == "show interfaces ib status":
            return self._ib_status()
        if line == "configuration write" and self.mode in ("enable", "config"):
            self.sw.saved += 1
            return ""
        if self.mode == "config":
            if line in self.sw.ignore:
                return ""
            if line == "ib sm":
                self.sw.sm_enabled = True
                return ""
            if line == "no ib sm":
                self.sw.sm_enabled = False
                return ""
            m = re.fullmatch(r"ib smnode (\S+) sm-priority (\d+)", line)
            if m and m.group(1) == self.sw.hostname and int(m.group(2)) <= 15:
                self.sw.sm_priority = int(m.group(2))
                return ""
        return f'% Unrecognized command "{words[0]}".\nType "?" for help.\n'

    def _ib_status(self) -> str:
        # Shape only (not a captured output): the tests keep this text, they never parse it.
        rows = [f"IB1/{i:<4}  Active  Enabled  LinkUp  4X  HDR" for i in range(1, 5)]
        return "Interface  State   Admin    Phys    Width  Speed\n" + "\n".join(rows) + "\n"

    # --- NVUE ------------------------------------------------------------------------------------------------
    _NV_SET: ClassVar[list[str]] = [
        r"qos roce mode (lossless|lossy)",
        r"qos pfc default-global switch-priority [0-7]",
        r"qos egress-queue-mapping default-global switch-priority [0-7] traffic-class [0-7]",
        r"qos mapping default-global trust (l2|l3|both|port)",
        r"qos mapping default-global dscp \d+ switch-priority [0-7]",
        r"qos congestion-control default-global traffic-class [0-7] (min-threshold|max-threshold) \d+",
        r"qos congestion-control default-global traffic-class [0-7] ecn (enable|disable)",
        r"interface swp\d+(-\d+)? link mtu \d+",
    ]

    def _nvue(self, line: str) -> str:
        if line.startswith("nv set "):
            path = line.removeprefix("nv set ")
            if not any(re.fullmatch(p, path) for p in self._NV_SET):
                return f"Error: Invalid Command: {line}\n"
            if line not in self.sw.ignore:
                key, _, value = path.rpartition(" ")
                self.sw.staged[key] = value
            return ""
        if line in ("nv config apply -y", "nv config apply --assume-yes"):
            self.sw.applied.update(self.sw.staged)
            self.sw.staged.clear()
            self.sw.saved += 1
            return f"applied [rev_id: {self.sw.saved}]\n"
        if line == "nv show qos roce":
            return self._show_qos_roce()
        return f"-bash: {line.split()[0]}: command not found\n"

    def _show_qos_roce(self) -> str:
        a = self.sw.applied
        mode = a.get("qos roce mode")
        if mode is None:
            return "                    operational  applied\n" + "-" * 18 + "  " + "-" * 11 + "  -------\nenable" \
                + " " * 37 + "off\n"
        trust = {"l3": "dscp", "l2": "pcp", "both": "pcp,dscp", "port": "port"}[
            a.get("qos mapping default-global trust", "both")]
        tc = next((k.split()[-2] for k in a if k.endswith(" ecn") and a[k] == "enable"), None)
        rows = [("enable", "on"), ("mode", mode), ("pfc", ""),
                ("  pfc-priority", a.get("qos pfc default-global switch-priority", "3")),
                ("  rx-enabled", "enabled"), ("  tx-enabled", "enabled"), ("congestion-control", ""),
                ("  congestion-mode", "ECN" if tc else "none"), ("  enabled-tc", f"0,{tc}" if tc else "0"),
                ("trust", ""), ("  trust-mode", trust)]
        out = ["                    operational  applied", "-" * 18 + "  " + "-" * 11 + "  " + "-" * 11]
        for k, v in rows:
            out.append(f"{k:<18}  {'':<11}  {v}".rstrip())
        out += ["RoCE PCP/DSCP->SP mapping configurations", "=" * 43, "(emulated)"]
        return "\n".join(out) + "\n"
