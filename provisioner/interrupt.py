"""Ctrl-C, SIGTERM and SIGHUP during a run: the first ends the run cleanly, a second one at once.

While a run is going (:func:`interruptible`), the first signal either raises :class:`Interrupted` in the main
thread (Python code: a step, the engine) or, while ansible-playbook runs (:func:`child_running`), sends it
SIGTERM: ansible-playbook passes that on to its workers, which end their own sessions (module processes, ssh),
so nothing of the playbook keeps running. `run_playbook` raises once the child is gone; should it not be gone
after GRACE_S, :func:`cancel_requested` (ansible-runner's `cancel_callback`) lets ansible-runner SIGKILL it.
The engine then records the phase as interrupted, closes the journal, and the command exits 128 + the signal
(130 Ctrl-C, 143 SIGTERM, 129 SIGHUP).

A second signal does not wait: the registered abort hooks close the journal (and scrub the current
artifacts), ansible-playbook gets SIGTERM and at most a second before its process group is killed, and the
process exits.

Why this module exists: ansible-runner installs its own SIGINT/SIGTERM handlers on every run unless given a
cancel callback, and leaves them installed afterwards, so once the first playbook had run every later
Ctrl-C or SIGTERM was swallowed and the run went on to report "passed".
SIGKILL cannot be caught: the journal stays `running` and the next run recognises it as dead
(`provisioner.state.close_dead_runs`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
GRACE_S = 10.0
"""How long ansible-playbook may take to stop its workers after SIGTERM before it is killed."""
ABORT_GRACE_S = 1.0


class Interrupted(BaseException):
    """The run was interrupted by `signum`. A BaseException, so no `except Exception` carries on past it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.journal: Any = None  # the closed RunJournal, when the engine had one

    @property
    def signame(self) -> str:
        try:
            return signal.Signals(self.signum).name
        except ValueError:
            return f"signal {self.signum}"

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def __str__(self) -> str:
        return f"interrupted by {self.signame}"


class _State:
    def __init__(self) -> None:
        self.depth = 0                              # nested interruptible() blocks
        self.requested: int | None = None           # the first signal of this run
        self.at = 0.0                               # when it came (time.monotonic)
        self.children = 0                           # nested child_running() blocks
        self.previous: dict[int, Any] = {}          # handlers to restore
        self.abort_hooks: list[Callable[[int], None]] = []


_S = _State()


def _handler(signum: int, frame: FrameType | None) -> None:
    if _S.requested is None:
        _S.requested, _S.at = signum, time.monotonic()
        if _S.children == 0:
            raise Interrupted(signum)
        for pid in child_leaders():  # ansible-playbook: it stops its workers on SIGTERM
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        return
    abort_now(signum)


def abort_now(signum: int) -> None:
    """The second signal: close what can be closed in a moment, stop our ansible-playbook children, exit."""
    for hook in reversed(list(_S.abort_hooks)):
        with contextlib.suppress(BaseException):
            hook(signum)
    stop_children(ABORT_GRACE_S)
    os._exit(128 + signum)


def child_leaders() -> list[int]:
    """This process's children that lead a process group of their own: ansible-runner starts ansible-playbook
    in its own session, which the terminal's Ctrl-C never reaches."""
    me = os.getpid()
    out: list[int] = []
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return out
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[0] != "Z" and int(fields[1]) == me and int(fields[2]) == pid:
            out.append(pid)
    return out


def stop_children(grace_s: float) -> list[int]:
    """SIGTERM each child group leader, wait up to `grace_s` for it to end, then SIGKILL its group."""
    leaders = child_leaders()
    for pid in leaders:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    alive = set(leaders)
    while alive and time.monotonic() < deadline:
        for pid in list(alive):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                alive.discard(pid)
        if alive:
            time.sleep(0.05)
    for pid in leaders:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
    return leaders


def kill_run_processes(run_dir: Path) -> list[int]:
    """SIGKILL the process groups of ansible-playbook processes left by a run that died (their ANSIBLE_CONFIG
    lies under its run directory): SIGKILL of `provision` does not reach a child in its own session, which
    would otherwise go on converging nodes beside the run that resumes."""
    marker = f"ANSIBLE_CONFIG={run_dir.resolve()}/".encode()
    killed: list[int] = []
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return killed
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        if any(item.startswith(marker) for item in env.split(b"\0")):
            with contextlib.suppress(OSError):
                group = os.getpgid(pid)
                if group != os.getpgrp():  # never our own group
                    os.killpg(group, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Handle SIGINT/SIGTERM/SIGHUP as described above for the duration of the block (re-entrant).

    Outside the main thread signals cannot be handled there; the block then changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _S.depth == 0:
        _S.requested = None
        _S.previous = {int(s): signal.signal(s, _handler) for s in SIGNALS}
    _S.depth += 1
    try:
        yield
    finally:
        _S.depth -= 1
        if _S.depth == 0:
            for s, h in _S.previous.items():
                signal.signal(s, h if h is not None else signal.SIG_DFL)
            _S.previous = {}
            _S.requested = None


@contextlib.contextmanager
def child_running() -> Iterator[None]:
    """While a child process does the work, a first signal only asks it to stop (see cancel_requested)."""
    _S.children += 1
    try:
        yield
    finally:
        _S.children -= 1


@contextlib.contextmanager
def on_abort(hook: Callable[[int], None]) -> Iterator[None]:
    """Run `hook(signum)` if a second signal aborts the process inside this block (keep it quick)."""
    _S.abort_hooks.append(hook)
    try:
        yield
    finally:
        _S.abort_hooks.remove(hook)


def requested() -> int | None:
    """The signal that interrupted this run, if one did."""
    return _S.requested


def cancel_requested() -> bool:
    """ansible-runner's cancel_callback: True when ansible-playbook has not stopped GRACE_S after the signal
    (ansible-runner then kills its process group)."""
    return _S.requested is not None and time.monotonic() - _S.at > GRACE_S


def check() -> None:
    """Raise Interrupted if a signal came while a child was running (call once the child is gone)."""
    if _S.requested is not None:
        raise Interrupted(_S.requested)
