"""Stand-in for Open MPI 4.1's ``mpirun`` and ``orted`` (Debian bookworm's openmpi-bin 4.1.4), stdlib only.

Only what the product and nccl-tests depend on, each as Open MPI documents it (mpirun(1) of 4.1,
open-mpi.org/doc/current/man1/mpirun.1.php; docs.open-mpi.org tuning-apps/environment-var):

- hosts: ``--hostfile``/``--machinefile`` lines ``host slots=N`` (N defaults to the processor cores,
  ``#`` starts a comment) or ``-H/--host h1[:N],h2`` (N defaults to 1); neither: this host only;
- ``-np/-n N`` (default: every slot); more ranks than slots is refused with Open MPI's "There are not
  enough slots available" text unless ``--oversubscribe``; ``-N N``/``--npernode N``/``--map-by ppr:N:node``
  put N ranks on each host; ranks fill a host before the next (``--map-by slot``, the default);
- ``-x VAR`` exports mpirun's own ``VAR``, ``-x VAR=value`` sets it, in every rank; ``--mca k v`` reaches
  the ranks as ``OMPI_MCA_k=v``;
- as root it refuses to start unless ``--allow-run-as-root`` or both ``OMPI_ALLOW_RUN_AS_ROOT=1`` and
  ``OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1`` (open-mpi/ompi PR #6911);
- ranks on this host are forked; every other host gets one ``orted`` started through the rsh agent
  (``plm_rsh_agent``, default ``ssh : rsh``, the first one in PATH; ``ssh -x host orted ...``), so
  node-to-node SSH keys and known_hosts must really be in place (an unknown host key is "Host key
  verification failed." and Open MPI's "ORTE was unable to reliably start one or more daemons");
  ``orted`` must exist on the remote host (openmpi-bin installed there);
- every rank gets ``OMPI_COMM_WORLD_SIZE/RANK/LOCAL_RANK/LOCAL_SIZE/NODE_RANK``, ``OMPI_UNIVERSE_SIZE``
  and the job's ``PMIX_NAMESPACE``; rank output is relayed to mpirun's stdout/stderr;
- a rank exiting non-zero aborts the job: mpirun prints Open MPI's "mpirun detected that one or more
  processes exited with non-zero status" block and exits with that status.

Not simulated: binding, MIMD ``:`` contexts, tree spawn (the launcher starts every daemon itself, as
Open MPI does with ``--mca plm_rsh_no_tree_spawn 1``), resource-manager launch.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

try:
    from provisioner.lab.simtools import fabsim_common as common
except ImportError:  # inside a node
    import fabsim_common as common  # type: ignore[import-not-found,no-redef]

RULE = "-" * 74
ROOT_TEXT = f"""{RULE}
mpirun has detected an attempt to run as root.

Running as root is *strongly* discouraged as any mistake (e.g., in
defining TMPDIR) or bug can result in catastrophic damage to the OS
file system, leaving your system in an unusable state.

We strongly suggest that you run mpirun as a non-root user.

You can override this protection by adding the --allow-run-as-root option
to the cmd line or by setting two environment variables in the following way:
the variable OMPI_ALLOW_RUN_AS_ROOT=1 to indicate the desire to override this
protection, and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 to confirm the choice and
add one more layer of certainty that you want to do so.
We reiterate our advice against doing so - please proceed at your own risk.
{RULE}"""
SLOTS_TEXT = """{rule}
There are not enough slots available in the system to satisfy the {np}
slots that were requested by the application:

  {app}

Either request fewer slots for your application, or make more slots
available for use.

A "slot" is the Open MPI term for an allocatable unit where we can
launch a process.  The number of slots available are defined by the
environment in which Open MPI processes are run:

  1. Hostfile, via "slots=N" clauses (N defaults to number of
     processor cores if not provided)
  2. The --host command line parameter, via a ":N" suffix on the
     hostname (N defaults to 1 if not provided)
  3. Resource manager (e.g., SLURM, PBS/Torque, LSF, etc.)
  4. If none of a hostfile, the --host command line parameter, or an
     RM is present, Open MPI defaults to the number of processor cores

In all the above cases, if you want Open MPI to default to the number
of hardware threads instead of the number of processor cores, use the
--use-hwthread-cpus option.

Alternatively, you can use the --oversubscribe option to ignore the
number of available slots when deciding the number of processes to
launch.
{rule}"""
DAEMON_TEXT = f"""{RULE}
ORTE was unable to reliably start one or more daemons.
This usually is caused by:

* not finding the required libraries and/or binaries on
  one or more nodes. Please check your PATH and LD_LIBRARY_PATH
  settings, or configure OMPI with --enable-orterun-prefix-by-default

* lack of authority to execute on one or more specified nodes.
  Please verify your allocation and authorities.

* the inability to write startup files into /tmp (--tmpdir/orte_tmpdir_base).
  Please check with your sys admin to determine the correct location to use.

*  compilation of the orted with dynamic libraries when static are required
  (e.g., on Cray). Please check your configure cmd line and consider using
  one of the contrib/platform definitions for your system type.

* an inability to create a connection back to mpirun due to a
  lack of common network interfaces and/or no route found between
  them. Please check network connectivity (including firewalls
  and network routing requirements).
{RULE}"""
VALUE_OPTIONS = {
    "-np": "np", "--np": "np", "-n": "np", "-c": "np", "--n": "np",
    "-H": "host", "--host": "host", "-host": "host",
    "--hostfile": "hostfile", "-hostfile": "hostfile", "--machinefile": "hostfile", "-machinefile": "hostfile",
    "--default-hostfile": "hostfile",
    "-N": "npernode", "--npernode": "npernode", "-npernode": "npernode",
    "--map-by": "map_by", "-map-by": "map_by", "--bind-to": "ignored", "-bind-to": "ignored",
    "--rank-by": "ignored", "--prefix": "ignored", "-wdir": "ignored", "--wdir": "ignored",
    "-x": "export",
}
FLAG_OPTIONS = {
    "--allow-run-as-root": "as_root", "--oversubscribe": "oversubscribe", "-oversubscribe": "oversubscribe",
    "--report-bindings": None, "--tag-output": None, "-tag-output": None, "--timestamp-output": None,
    "-q": None, "--quiet": None, "-v": None, "--verbose": None, "--display-map": None, "--use-hwthread-cpus": None,
}


class MpiError(Exception):
    """A usage error or refusal: the text mpirun prints and its exit status."""

    def __init__(self, text: str, rc: int = 1) -> None:
        super().__init__(text)
        self.text = text
        self.rc = rc


@dataclass
class Request:
    np: int | None = None
    hosts: list[tuple[str, int]] = field(default_factory=list)
    hostfile: str | None = None
    npernode: int | None = None
    exports: list[str] = field(default_factory=list)
    mca: dict[str, str] = field(default_factory=dict)
    as_root: bool = False
    oversubscribe: bool = False
    program: list[str] = field(default_factory=list)


def positive(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise MpiError(f"mpirun: {what} needs a number, got '{text}'") from None
    if value < 1:
        raise MpiError(f"mpirun: {what} must be positive, got {value}")
    return value


def parse_args(argv: Sequence[str]) -> Request:
    """mpirun's command line up to the program (everything after it belongs to the program)."""
    req = Request()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-"):
            req.program = list(argv[i:])
            break
        if arg in ("--mca", "-mca", "--gmca", "-gmca"):
            if i + 2 >= len(argv):
                raise MpiError(f"mpirun: option {arg} needs a name and a value")
            req.mca[argv[i + 1]] = argv[i + 2]
            i += 3
            continue
        if arg in FLAG_OPTIONS:
            name = FLAG_OPTIONS[arg]
            if name:
                setattr(req, name, True)
            i += 1
            continue
        if arg not in VALUE_OPTIONS:
            raise MpiError(f'mpirun: Error: unknown option "{arg}"\nType \'mpirun --help\' for usage.')
        if i + 1 >= len(argv):
            raise MpiError(f"mpirun: option {arg} needs a value")
        value, kind = argv[i + 1], VALUE_OPTIONS[arg]
        if kind == "np":
            req.np = positive(value, arg)
        elif kind == "host":
            for item in value.split(","):
                name, _, slots = item.partition(":")
                if name:
                    req.hosts.append((name, positive(slots, "--host slots") if slots else 1))
        elif kind == "hostfile":
            req.hostfile = value
        elif kind == "npernode":
            req.npernode = positive(value, arg)
        elif kind == "map_by":
            policy = value.split(":")
            if policy[0].lower() == "ppr":
                if len(policy) < 3 or policy[2].lower() != "node":
                    raise MpiError(f"mpirun: --map-by {value}: only ppr:N:node is supported by the lab")
                req.npernode = positive(policy[1], "ppr")
        elif kind == "export":
            req.exports.append(value)
        i += 2
    if not req.program:
        raise MpiError("mpirun: no executable was specified\nType 'mpirun --help' for usage.")
    return req


def parse_hostfile(text: str, path: str) -> list[tuple[str, int]]:
    """``host [slots=N] [max_slots=M]`` lines; ``#`` comments; slots default to the processor cores."""
    hosts = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        slots = os.cpu_count() or 1
        for word in words[1:]:
            key, eq, value = word.partition("=")
            if key in ("slots", "slot", "cpu", "count") and eq:
                slots = positive(value, f"{path}:{number} slots")
            elif key not in ("max_slots", "max-slots"):
                raise MpiError(f"{RULE}\nOpen RTE detected a parse error in the hostfile:\n    {path}\n"
                               f"It occured on line number {number} on token {len(words)}.\n{RULE}")
        hosts.append((words[0], slots))
    return hosts


def plan(req: Request, here: str) -> list[str]:
    """The host of every world rank, in rank order."""
    if req.hostfile:
        try:
            with open(req.hostfile, encoding="utf-8") as handle:
                hosts = parse_hostfile(handle.read(), req.hostfile)
        except OSError:
            raise MpiError(f"{RULE}\nOpen MPI was unable to open the hostfile:\n    {req.hostfile}\n"
                           f"Check to make sure the path and filename are correct.\n{RULE}") from None
    elif req.hosts:
        hosts = list(req.hosts)
    else:
        hosts = [(here, os.cpu_count() or 1)]
    merged: dict[str, int] = {}
    for name, slots in hosts:
        merged[name] = merged.get(name, 0) + slots
    app = req.program[0]
    if req.npernode:
        capacity = req.npernode * len(merged)
        np = req.np or capacity
        if np > capacity:
            raise MpiError(f"{RULE}\nYour job has requested more processes than the ppr for\nthis topology can "
                           f"support:\n\n  App: {app}\n  Number of procs:  {np}\n  PPR: {req.npernode}:node\n\n"
                           f"Please revise the conflict and try again.\n{RULE}")
        return [h for h in merged for _ in range(req.npernode)][:np]
    total = sum(merged.values())
    np = req.np or total
    if np > total and not req.oversubscribe:
        raise MpiError(SLOTS_TEXT.format(rule=RULE, np=np, app=app))
    order = [h for h, slots in merged.items() for _ in range(slots)]
    while len(order) < np:  # oversubscribed: round-robin over the hosts again
        order += list(merged)
    return order[:np]


def is_local(name: str, here: str) -> bool:
    """This host: its name, localhost, or an address a socket can bind here."""
    if name in (here, here.split(".")[0], "localhost", "127.0.0.1", "::1"):
        return True
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in name else socket.AF_INET, name)
    except OSError:
        return False
    try:
        with socket.socket(socket.AF_INET6 if ":" in name else socket.AF_INET) as sock:
            sock.bind((name, 0))
    except OSError:
        return False
    return True


def rank_env(req: Request, env: Mapping[str, str]) -> dict[str, str]:
    """What every rank gets on top of its own environment: the -x variables and the MCA settings."""
    out: dict[str, str] = {}
    for item in req.exports:
        name, eq, value = item.partition("=")
        if eq:
            out[name] = value
        elif name in env:
            out[name] = env[name]
    for key, value in req.mca.items():
        out[f"OMPI_MCA_{key}"] = value
    return out


def rsh_agent(req: Request, env: Mapping[str, str]) -> list[str]:
    spec = req.mca.get("plm_rsh_agent") or env.get("OMPI_MCA_plm_rsh_agent") or "ssh : rsh"
    for choice in spec.split(":"):
        words = shlex.split(choice)
        if words and shutil.which(words[0]):
            return words
    raise MpiError(f"{RULE}\nThe value of the MCA parameter \"plm_rsh_agent\" was set to a path\nthat could not "
                   f"be found:\n\n  plm_rsh_agent: {spec}\n\nPlease either unset the parameter, or check that "
                   f"the path is correct\n{RULE}")


class Relay:
    """Copies children's output to ours, line by line, under one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def attach(self, stream: IO[bytes] | None, target: IO[str]) -> None:
        if stream is None:
            return

        def pump() -> None:
            for raw in iter(stream.readline, b""):
                with self.lock:
                    target.write(raw.decode("utf-8", "replace"))
                    target.flush()

        thread = threading.Thread(target=pump, daemon=True)
        thread.start()
        self.threads.append(thread)

    def join(self) -> None:
        for thread in self.threads:
            thread.join(timeout=10)


def launch(req: Request, env: Mapping[str, str], out: IO[str], err: IO[str]) -> int:
    here = common.this_host()
    order = plan(req, here)
    size = len(order)
    job = f"{os.getpid()}{int(time.time()) % 100000:05d}@1"
    extra = rank_env(req, env)
    per_host: dict[str, list[int]] = {}
    for rank, host in enumerate(order):
        per_host.setdefault(host, []).append(rank)
    relay = Relay()
    children: list[tuple[subprocess.Popen[bytes], str, list[int]]] = []
    for host, ranks in per_host.items():
        specs = [{"rank": r, "local_rank": i, "local_size": len(ranks)} for i, r in enumerate(ranks)]
        common_env = {**extra, "OMPI_COMM_WORLD_SIZE": str(size), "OMPI_UNIVERSE_SIZE": str(size),
                      "PMIX_NAMESPACE": job}
        if is_local(host, here):
            for spec in specs:
                proc_env = {**env, **common_env, **spec_env(spec)}
                try:
                    proc = subprocess.Popen(req.program, env=proc_env, stdin=subprocess.DEVNULL,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                except OSError:
                    print(f"{RULE}\nmpirun was unable to launch the specified application as it could not "
                          f"access\nor execute an executable:\n\nExecutable: {req.program[0]}\nNode: {here}\n\n"
                          f"while attempting to start process rank {spec['rank']}.\n{RULE}", file=err)
                    terminate(children)
                    return 1
                relay.attach(proc.stdout, out)
                relay.attach(proc.stderr, err)
                children.append((proc, "rank", [int(spec["rank"])]))
        else:
            payload = base64.b64encode(json.dumps(
                {"env": common_env, "program": req.program, "ranks": specs}).encode()).decode()
            agent = rsh_agent(req, env)
            argv = [*agent, *(["-x"] if os.path.basename(agent[0]) == "ssh" else []), host,
                    f"orted --provisioner-lab-launch {payload}"]
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            relay.attach(proc.stdout, out)
            relay.attach(proc.stderr, err)
            children.append((proc, "daemon", ranks))
    return wait_all(children, relay, err)


def spec_env(spec: Mapping[str, Any]) -> dict[str, str]:
    return {"OMPI_COMM_WORLD_RANK": str(spec["rank"]), "OMPI_COMM_WORLD_LOCAL_RANK": str(spec["local_rank"]),
            "OMPI_COMM_WORLD_LOCAL_SIZE": str(spec["local_size"]),
            "OMPI_COMM_WORLD_NODE_RANK": str(spec["local_rank"])}


def terminate(children: Sequence[tuple[subprocess.Popen[bytes], str, list[int]]]) -> None:
    for proc, _, _ in children:
        if proc.poll() is None:
            proc.terminate()


def wait_all(children: list[tuple[subprocess.Popen[bytes], str, list[int]]], relay: Relay, err: IO[str]) -> int:
    """Wait for every rank/daemon; the first failure aborts the job as Open MPI does."""
    failed: tuple[str, int, list[int]] | None = None
    pending = list(children)
    while pending:
        for item in list(pending):
            proc, kind, ranks = item
            rc = proc.poll()
            if rc is None:
                continue
            pending.remove(item)
            if rc != 0 and failed is None:
                failed = (kind, rc, ranks)
                terminate(pending)
        time.sleep(0.02)
    relay.join()
    if failed is None:
        return 0
    kind, rc, ranks = failed
    if kind == "daemon" and rc in (127, 255):  # ssh could not log in, or no orted on the far side
        print(DAEMON_TEXT, file=err)
        return 1
    print(f"{'-' * 55}\nPrimary job  terminated normally, but 1 process returned\na non-zero exit code. Per "
          f"user-direction, the job has been aborted.\n{'-' * 55}", file=err)
    print(f"{RULE}\nmpirun detected that one or more processes exited with non-zero status, thus causing\nthe job "
          f"to be terminated. The first process to do so was:\n\n  Process name: [[{os.getpid() % 65536},1],"
          f"{ranks[0]}]\n  Exit code:    {rc}\n{RULE}", file=err)
    return rc


def orted(payload: str, out: IO[str], err: IO[str]) -> int:
    """The daemon on a remote host: start this host's ranks with the job's environment, relay, exit worst."""
    try:
        data = json.loads(base64.b64decode(payload.encode()).decode())
    except (ValueError, UnicodeDecodeError):
        print("orted: bad launch message", file=err)
        return 1
    relay = Relay()
    procs: list[subprocess.Popen[bytes]] = []
    for spec in data["ranks"]:
        proc_env = {**os.environ, **data["env"], **spec_env(spec)}
        try:
            proc = subprocess.Popen(list(data["program"]), env=proc_env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError:
            print(f"{RULE}\nmpirun was unable to launch the specified application as it could not access\nor "
                  f"execute an executable:\n\nExecutable: {data['program'][0]}\nNode: {common.this_host()}\n\n"
                  f"while attempting to start process rank {spec['rank']}.\n{RULE}", file=err)
            for p in procs:
                p.terminate()
            return 1
        relay.attach(proc.stdout, out)
        relay.attach(proc.stderr, err)
        procs.append(proc)
    codes = [p.wait() for p in procs]
    relay.join()
    worst = next((c for c in codes if c != 0), 0)
    return min(abs(worst), 254) if worst else 0


def main_mpirun(argv: Sequence[str]) -> int:
    env = dict(os.environ)
    try:
        req = parse_args(argv[1:])
        if os.geteuid() == 0 and not req.as_root and not (
            env.get("OMPI_ALLOW_RUN_AS_ROOT") == "1" and env.get("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM") == "1"
        ):
            raise MpiError(ROOT_TEXT)
        return launch(req, env, sys.stdout, sys.stderr)
    except MpiError as exc:
        print(exc.text, file=sys.stderr)
        return exc.rc


def main_orted(argv: Sequence[str]) -> int:
    if len(argv) == 3 and argv[1] == "--provisioner-lab-launch":
        return orted(argv[2], sys.stdout, sys.stderr)
    print("orted: this daemon is started by mpirun", file=sys.stderr)
    return 1
