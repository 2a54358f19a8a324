"""The molecule scenarios' pipelined podman connection (molecule/_shared/connection_plugins/podman.py).

Why these tests: the plugin is what makes the scenarios affordable on 2 cores (one ``podman exec``
per module instead of five), and it only works if (a) Ansible resolves the bare connection name
``podman`` that molecule's driver writes to it rather than to the collection, (b) a pipelined module
really reaches the container's stdin (``--interactive``), and (c) async tasks keep using files.
No containers: ``_podman`` is replaced by a recorder.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("ansible_collections.containers.podman")

from ansible.playbook.play_context import PlayContext
from ansible.plugins.loader import connection_loader

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_DIR = ROOT / "molecule/_shared/connection_plugins"
BASE_CONFIG = ROOT / ".config/molecule/config.yml"


@pytest.fixture(scope="module")
def connection_class() -> Any:
    """The class Ansible loads for ``ansible_connection: podman`` once the scenarios' plugin dir is configured."""
    connection_loader.add_directory(str(PLUGIN_DIR))
    conn = connection_loader.get("podman", PlayContext(), None)
    assert conn is not None
    return type(conn)


class Recorder:
    """Stands in for ``Connection._podman``: records argv, answers ``mount`` with a directory."""

    def __init__(self, mount_point: Path) -> None:
        self.calls: list[tuple[list[str], bytes | None]] = []
        self.mount_point = mount_point

    def __call__(self, cmd: Any, cmd_args: list[str] | None = None, in_data: bytes | None = None,
                 use_container_id: bool = True) -> tuple[int, bytes, bytes]:
        argv = [cmd] if isinstance(cmd, str) else list(cmd)
        if use_container_id:
            argv.append("mol-x")
        argv += cmd_args or []
        self.calls.append((argv, in_data))
        if argv[0] == "mount":
            return 0, str(self.mount_point).encode(), b""
        return 0, b"out", b""


def _connection(cls: Any, tmp_path: Path) -> tuple[Any, Recorder]:
    ctx = PlayContext()
    ctx.remote_addr = "mol-x"
    conn = cls(ctx, None)
    mount = tmp_path / "merged"
    (mount / "tmp").mkdir(parents=True)
    (mount / "etc").mkdir()
    recorder = Recorder(mount)
    conn._podman = recorder
    return conn, recorder


def test_the_bare_name_podman_resolves_to_the_scenarios_plugin(connection_class: Any) -> None:
    assert Path(inspect.getfile(connection_class)).resolve() == (PLUGIN_DIR / "podman.py").resolve()


def test_modules_are_pipelined_but_async_tasks_are_not(connection_class: Any, tmp_path: Path) -> None:
    conn, _ = _connection(connection_class, tmp_path)
    assert conn.is_pipelining_enabled() is True
    assert conn.is_pipelining_enabled(wrap_async=True) is False


def test_a_pipelined_module_goes_to_stdin_of_one_interactive_exec(connection_class: Any, tmp_path: Path) -> None:
    conn, rec = _connection(connection_class, tmp_path)
    rc, out, _ = conn.exec_command("/bin/sh -c '/usr/bin/python3 && sleep 0'", in_data=b"MODULE")
    assert (rc, out) == (0, b"out")
    assert rec.calls == [(["exec", "--interactive", "mol-x", "/bin/sh", "-c", "/usr/bin/python3 && sleep 0"],
                          b"MODULE")]


def test_a_plain_command_does_not_hold_stdin_open(connection_class: Any, tmp_path: Path) -> None:
    conn, rec = _connection(connection_class, tmp_path)
    conn.exec_command("/bin/sh -c 'echo ~'")
    assert rec.calls == [(["exec", "mol-x", "/bin/sh", "-c", "echo ~"], None)]


def test_the_filesystem_is_mounted_once_and_only_when_a_file_moves(connection_class: Any, tmp_path: Path) -> None:
    conn, rec = _connection(connection_class, tmp_path)
    conn.exec_command("true")
    assert [c[0][0] for c in rec.calls] == ["exec"]
    src = tmp_path / "src.txt"
    src.write_text("payload\n")
    conn.put_file(str(src), "/tmp/a.txt")
    conn.put_file(str(src), "/tmp/b.txt")
    conn.fetch_file("/tmp/a.txt", str(tmp_path / "back.txt"))
    assert [c[0][0] for c in rec.calls] == ["exec", "mount"]
    assert (rec.mount_point / "tmp/b.txt").read_text() == "payload\n"
    assert (tmp_path / "back.txt").read_text() == "payload\n"


def test_molecules_base_config_points_every_scenario_at_the_plugin() -> None:
    data = yaml.safe_load(BASE_CONFIG.read_text(encoding="utf-8"))
    plugin_path = data["ansible"]["cfg"]["defaults"]["connection_plugins"]
    assert plugin_path == "${MOLECULE_PROJECT_DIRECTORY}/molecule/_shared/connection_plugins"
    assert (PLUGIN_DIR / "podman.py").is_file()
