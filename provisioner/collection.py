"""Where the Ansible content is: the collection `provisioner.cluster` (roles, per-phase playbooks, inventory plugin).

The collection ships inside this package, at ``provisioner/ansible_collections/provisioner/cluster``, and is found
with :mod:`importlib.resources`, never relative to a source checkout. In a checkout (and an editable install) its
``roles``, ``playbooks`` and ``plugins`` are links to the repository's top-level directories, so molecule, the
linters and the lab keep working on those; the wheel build follows the links and carries copies. So the same code
finds the same files whether `provision` runs from the repository or from a `pipx install` in any directory.

How the content is used: `provision` runs each phase's playbook with ``roles_path`` set to the collection's
``roles`` directory and the playbook given by path, outside any configured collections path, so the roles run as
plain roles with the filter and module plugins they carry (``roles/*/filter_plugins``, ``roles/*/library``).
Ansible itself finds the collection (the inventory plugin ``provisioner.cluster.spec``, for `ansible-inventory` and
AWX) through ``collections_path``: :func:`collections_root` is the directory to add there
(`provision collection-path` prints it).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from provisioner.errors import ProvisionerError

NAMESPACE = "provisioner"
NAME = "cluster"
FQCN = f"{NAMESPACE}.{NAME}"
INVENTORY_PLUGIN = f"{FQCN}.spec"


class ContentMissing(ProvisionerError):
    """A playbook or role the run needs is not where the package keeps it (a broken install or checkout)."""

    exit_code = 2


@dataclass(frozen=True)
class Collection:
    """The collection's directory and what is in it; `checkout` when its content links to a source checkout."""

    root: Path
    checkout: bool

    @property
    def collections_root(self) -> Path:
        """The directory holding ``ansible_collections/``: what Ansible's ``collections_path`` needs."""
        return self.root.parents[2]

    @property
    def roles_dir(self) -> Path:
        return (self.root / "roles").resolve()

    @property
    def playbooks_dir(self) -> Path:
        return (self.root / "playbooks").resolve()

    @property
    def plugins_dir(self) -> Path:
        return (self.root / "plugins").resolve()

    def fix_hint(self, missing: Path) -> str:
        """How to get a missing file of the collection back, for the kind of installation this is."""
        mine = any(missing.resolve().is_relative_to(d) for d in (self.roles_dir, self.playbooks_dir, self.plugins_dir))
        if not mine:
            return f"it is not part of {FQCN} ({self.root}); give a directory that has it"
        if self.checkout:
            return f"restore it in the source checkout: git checkout -- {_checkout_relative(missing)}"
        return "the installed provisioner package is incomplete: reinstall it, e.g. pipx reinstall provisioner"


def _checkout_relative(path: Path) -> str:
    """`path` relative to the checkout root (the parent of the package), for a git command; else as it is."""
    top = Path(str(files("provisioner"))).resolve().parent
    try:
        return str(path.resolve().relative_to(top))
    except ValueError:
        return str(path)


@functools.cache
def collection() -> Collection:
    """The collection shipped with this package (cached: it does not move while the process runs)."""
    res = files("provisioner").joinpath("ansible_collections", NAMESPACE, NAME)
    if not isinstance(res, os.PathLike) or not res.is_dir():
        raise ContentMissing(f"the Ansible collection {FQCN} is not inside the provisioner package ({res})",
                             hint="install provisioner from a wheel or a source checkout (pipx install .), "
                                  "not from a zip")
    root = Path(os.fspath(res))
    return Collection(root, checkout=(root / "roles").is_symlink())


def collections_root() -> Path:
    return collection().collections_root


def roles_dir() -> Path:
    return collection().roles_dir


def playbooks_dir() -> Path:
    return collection().playbooks_dir


def require_playbook(playbook: Path, phase: str | None = None) -> None:
    """Raise :class:`ContentMissing` (one line: the file, how to fix it) unless `playbook` is a file."""
    if playbook.is_file():
        return
    try:
        hint = collection().fix_hint(playbook)
    except ContentMissing as exc:
        hint = str(exc)
    where = f"phase {phase}: " if phase else ""
    raise ContentMissing(f"{where}playbook {playbook} is missing", hint=hint)
