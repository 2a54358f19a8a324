# Connection plugin for the molecule scenarios: containers.podman.podman with module pipelining.
"""``podman`` connection with pipelining, for the lab's molecule scenarios.

Why: molecule's podman driver writes ``ansible_connection: podman`` for every platform, and the
collection's plugin runs each task as five podman calls (mount, mkdir of a remote temporary
directory, copy, run, rm), about 0.4 s each on a loaded 2-core machine.  It cannot pipeline only
because its ``podman exec`` does not pass ``--interactive``, so the module sent on stdin never
arrives.  This subclass passes it, pipelines every module (one ``podman exec`` per task) and
mounts the container's filesystem only when a file really has to be copied.  What runs inside the
node is unchanged: the same modules, the same interpreter, as root.

Molecule's base config (``.config/molecule/config.yml``, merged under every scenario) names this
directory in ``connection_plugins``; a plugin found there takes precedence over the collection's
routing of the bare name ``podman``.
"""

from __future__ import annotations

import shlex

from ansible import constants as C
from ansible.module_utils.common.text.converters import to_native
from ansible.plugins.connection import ConnectionBase, ensure_connect
from ansible_collections.containers.podman.plugins.connection.podman import (  # type: ignore[import-untyped]
    Connection as PodmanConnection,
)

DOCUMENTATION = """
    name: podman
    short_description: Run tasks in a podman container, modules pipelined over podman exec stdin
    description:
      - The containers.podman.podman connection, with pipelining and a lazy filesystem mount.
    author: provisioner molecule scenarios
    options:
      remote_addr:
        description: The name or ID of the container.
        default: inventory_hostname
        vars:
          - name: ansible_host
          - name: inventory_hostname
          - name: ansible_podman_host
      remote_user:
        description: User to run commands as inside the container.
        ini:
          - section: defaults
            key: remote_user
        env:
          - name: ANSIBLE_REMOTE_USER
        vars:
          - name: ansible_user
      podman_extra_args:
        description: Extra arguments for every podman command line.
        default: ''
        ini:
          - section: defaults
            key: podman_extra_args
        vars:
          - name: ansible_podman_extra_args
        env:
          - name: ANSIBLE_PODMAN_EXTRA_ARGS
      podman_executable:
        description: The podman executable.
        default: podman
        vars:
          - name: ansible_podman_executable
        env:
          - name: ANSIBLE_PODMAN_EXECUTABLE
"""


class Connection(PodmanConnection):  # type: ignore[misc]
    """Pipelined podman connection: one ``podman exec --interactive`` per module."""

    transport = "podman"
    has_pipelining = True

    def is_pipelining_enabled(self, wrap_async: bool = False) -> bool:
        """Always pipeline, whatever ANSIBLE_PIPELINING says, except async tasks and kept remote files.

        (``always_pipeline_modules`` would also tell Ansible the connection runs async jobs itself,
        which podman cannot: async tasks then fail with "No job id was returned".)
        """
        return not wrap_async and not C.DEFAULT_KEEP_REMOTE_FILES

    def _connect(self) -> Connection:
        """Connect without mounting: most tasks never copy a file, and a mount costs a podman call."""
        ConnectionBase._connect(self)
        self._connected = True
        return self

    def _mount_once(self) -> None:
        """Mount the container's filesystem the first time a file is copied in or out."""
        if self._mount_point is None:
            PodmanConnection._connect(self)

    @ensure_connect  # type: ignore[untyped-decorator]
    def exec_command(self, cmd: str, in_data: bytes | None = None, sudoable: bool = False) -> tuple[int, bytes, bytes]:
        """``podman exec``, with ``--interactive`` when there is stdin to pass (a pipelined module)."""
        ConnectionBase.exec_command(self, cmd, in_data=in_data, sudoable=sudoable)
        args = ["exec"]
        if in_data is not None:
            args.append("--interactive")
        if self.user:
            args.extend(("--user", self.user))
        rc, out, err = self._podman(args, shlex.split(to_native(cmd, errors="surrogate_or_strict")), in_data)
        return rc, out, err

    def put_file(self, in_path: str, out_path: str) -> None:
        """Copy through the mounted filesystem (mounted on first use)."""
        self._mount_once()
        super().put_file(in_path, out_path)

    def fetch_file(self, in_path: str, out_path: str) -> None:
        """Copy out through the mounted filesystem (mounted on first use)."""
        self._mount_once()
        super().fetch_file(in_path, out_path)
