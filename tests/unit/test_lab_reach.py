"""lab up's last step: every node's sshd answers on its lab address from this host (the product's own path).

Traffic only to loopback: a listener here stands in for a node's sshd."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from provisioner.lab import network


@pytest.fixture
def listener() -> Iterator[tuple[socket.socket, list[bytes]]]:
    """A loopback TCP server that sends each connection the bytes queued in ``say`` (nothing when empty)."""
    server = socket.create_server(("127.0.0.1", 0))
    say: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                if say:
                    conn.sendall(say[0])
                stop.wait(0.5)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server, say
    stop.set()
    thread.join(2)
    server.close()


def test_banner_is_read_from_a_real_sshd_like_listener(listener: tuple[socket.socket, list[bytes]]) -> None:
    server, say = listener
    say.append(b"SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n")
    assert network.ssh_banner("127.0.0.1", server.getsockname()[1]) == "SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3"


def test_a_port_that_accepts_but_says_nothing_is_not_ssh(listener: tuple[socket.socket, list[bytes]]) -> None:
    server, _ = listener
    assert network.ssh_banner("127.0.0.1", server.getsockname()[1], timeout=0.3) is None


def test_a_closed_port_is_no_answer() -> None:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    assert network.ssh_banner("127.0.0.1", port, timeout=0.5) is None


def test_wait_retries_until_a_late_node_answers_and_names_the_one_that_never_does() -> None:
    now = [0.0]
    calls: dict[str, int] = {}

    def probe(ip: str) -> str | None:
        calls[ip] = calls.get(ip, 0) + 1
        if ip == "10.213.38.11" and calls[ip] >= 3:  # a stale ARP entry: the first SYNs go nowhere
            return "SSH-2.0-x"
        return "SSH-2.0-x" if ip == "10.213.38.12" else None

    def sleep(s: float) -> None:
        now[0] += s

    silent = network.wait_for_ssh({"gpu01": "10.213.38.11", "gpu02": "10.213.38.12", "sm1": "10.213.38.21"},
                                  budget_s=5, probe=probe, clock=lambda: now[0], sleep=sleep)
    assert list(silent) == ["sm1"]
    assert silent["sm1"].startswith("10.213.38.21:22 gave no SSH banner within 5 s (route: ")
    assert calls["10.213.38.12"] == 1 and calls["10.213.38.11"] == 3 and calls["10.213.38.21"] >= 5


def test_wait_with_every_node_answering_probes_each_once() -> None:
    seen: list[str] = []

    def probe(ip: str) -> str | None:
        seen.append(ip)
        return "SSH-2.0-x"

    assert network.wait_for_ssh({"a": "10.213.38.11", "b": "10.213.38.12"}, probe=probe) == {}
    assert sorted(seen) == ["10.213.38.11", "10.213.38.12"]
