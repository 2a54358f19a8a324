"""Running one ``ib_write_bw`` pair over the remote layer: server in the background, client, both bounded.

Shared by the bandwidth check (host memory, per rail) and the GPUDirect check (``--use_cuda=<gpu>``). Each
rail's test in a round uses its own TCP port (18515 + rail) so the rails of a pair run at the same time
without their perftest rendezvous colliding. A dead or hung peer gives a result with ``gbps=None`` and the
reason, never a hang: the server and client both run under deadlines.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from provisioner.errors import ParseError, RemoteError
from provisioner.parsers import parse
from provisioner.parsers.perftest import cuda_options
from provisioner.remote import Remote
from provisioner.spec.cluster import Port

BASE_TCP_PORT = 18515


@dataclass(frozen=True, slots=True)
class PerftestSettings:
    """Message size and duration from ``spec.verify.bandwidth``, plus the timing knobs."""

    size: int
    duration: int
    server_grace_s: float = 0.5  # let the server bind before the client connects (real perftest does not retry)
    slack_s: float = 20.0  # setup time on top of -D before a run counts as hung


@dataclass(frozen=True, slots=True)
class PairRun:
    """The outcome of one pair: bandwidth (Gb/s, average) or None with the reason.

    ``tool_refused`` is set when the perftest build itself refused the GPU memory options (built without
    CUDA or without DMA-BUF): nothing was measured and no port or node is at fault.
    """

    gbps: float | None
    detail: str
    tool_refused: str | None = None


def perftest_argv(
    port: Port,
    settings: PerftestSettings,
    tcp_port: int,
    *,
    numactl: bool,
    server: str | None = None,
    use_cuda: int | None = None,
    cuda_dmabuf: bool = False,
) -> list[str]:
    """``[numactl --cpunodebind=N] ib_write_bw -d DEV -i PORT -s SIZE -D DUR --report_gbits -F -p TCP [...]``.

    ``numactl`` pins to the HCA's NUMA node only when the tool exists on the node and the spec knows the
    node (a wrong pin is worse than none). ``server`` is the address the client connects to. ``cuda_dmabuf``
    adds ``--use_cuda_dmabuf`` after ``--use_cuda`` (perftest refuses it before: issue #336).
    """
    argv: list[str] = []
    if numactl and port.numa is not None:
        argv += ["numactl", f"--cpunodebind={port.numa}"]
    argv += [
        "ib_write_bw", "-d", port.device, "-i", str(port.port), "-s", str(settings.size),
        "-D", str(settings.duration), "--report_gbits", "-F", "-p", str(tcp_port),
    ]
    if use_cuda is not None:
        argv.append(f"--use_cuda={use_cuda}")
        if cuda_dmabuf:
            argv.append("--use_cuda_dmabuf")
    if server is not None:
        argv.append(server)
    return argv


def _tail(text: str, lines: int = 3) -> str:
    kept = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(kept[-lines:])


def read_result(rc: int, stdout: str, stderr: str) -> PairRun:
    """Bandwidth from the client's output, or why there is none (perftest error, timeout, no rows)."""
    if rc == 124:
        return PairRun(None, "timed out: the peer hung or died" + (f" ({_tail(stderr, 1)})" if stderr else ""))
    if rc == 255:
        return PairRun(None, f"node unreachable: {_tail(stderr, 1)}")
    refused = cuda_options(stdout + "\n" + stderr)["refused"] if rc else None
    if refused:
        return PairRun(None, f"exit {rc}: {refused}", tool_refused=refused)
    try:
        parsed = parse("perftest", stdout + ("\n" + stderr if rc else ""))
    except ParseError:
        return PairRun(None, f"exit {rc}: {_tail(stderr or stdout)}" if (stderr or stdout) else f"exit {rc}")
    if rc != 0 or not parsed.get("ok", False) or parsed.get("bw_avg_gbps") is None:
        why = parsed.get("error") or _tail(stderr) or "no result rows"
        return PairRun(None, f"exit {rc}: {why}")
    return PairRun(float(parsed["bw_avg_gbps"]), "")


CONNECT_ATTEMPTS = 3
"""Client attempts while the server is not listening yet (perftest itself never retries)."""


def run_pair(
    remote: Remote,
    server: tuple[str, Port, bool],
    client: tuple[str, Port, bool],
    server_address: str,
    settings: PerftestSettings,
    tcp_port: int,
    *,
    use_cuda: tuple[int, int] | None = None,
    cuda_dmabuf: bool = False,
    sleep: Callable[[float], None] = time.sleep,
) -> PairRun:
    """One ``ib_write_bw`` run: ``server``/``client`` are (host, port, numactl available)."""
    s_host, s_port, s_numa = server
    c_host, c_port, c_numa = client
    budget = settings.duration + settings.slack_s
    s_argv = perftest_argv(s_port, settings, tcp_port, numactl=s_numa, use_cuda=use_cuda[0] if use_cuda else None,
                           cuda_dmabuf=cuda_dmabuf)
    c_argv = perftest_argv(c_port, settings, tcp_port, numactl=c_numa, server=server_address,
                           use_cuda=use_cuda[1] if use_cuda else None, cuda_dmabuf=cuda_dmabuf)
    try:
        bg = remote.start(s_host, s_argv, timeout=budget + settings.server_grace_s + 5)
    except RemoteError as exc:
        return PairRun(None, f"server {s_host} unreachable: {exc.message}")
    try:
        for attempt in range(CONNECT_ATTEMPTS):
            # The server needs a moment to listen (longer on a loaded node); a client that came too early
            # fails at once with "Couldn't connect" and nothing ran, so trying again costs no accuracy.
            sleep(settings.server_grace_s * (attempt + 1))
            try:
                done = remote.run(c_host, c_argv, timeout=budget)
            except RemoteError as exc:
                return PairRun(None, f"client {c_host} unreachable: {exc.message}")
            if done.rc == 0 or "Couldn't connect" not in done.stdout + done.stderr:
                break
        result = read_result(done.rc, done.stdout, done.stderr)
        srv = bg.wait(timeout=5 if done.rc == 0 else 1)
        if result.gbps is None and srv.rc not in (0, 124) and srv.stderr.strip():
            refused = result.tool_refused or cuda_options(srv.stdout + "\n" + srv.stderr)["refused"]
            result = PairRun(None, f"{result.detail}; server {s_host}: {_tail(srv.stderr, 2)}", refused)
        return result
    finally:
        bg.kill()
