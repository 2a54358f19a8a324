#!/usr/bin/python3
"""Simulated ``modprobe``, ``lsmod``, ``rmmod``, ``modinfo`` and ``dmesg`` for lab nodes (stdlib only).

A lab node is a container on a kernel with no InfiniBand or GPU modules, so kmod's
real tools cannot load anything.  This one script is installed five times into
``/usr/local/sbin`` (ahead of the real ones in root's PATH) and picks its role from the name
it was called by.  It keeps the node's loaded modules in
``/run/lab/nodes/<hostname>/modules.json`` through the shared ``labstate`` module, so
the fault injector and the other simulated tools (``ib_write_bw --use_cuda`` needs
``nvidia_peermem``) see the same state.

Like the real modprobe, it loads a module only when a module file exists under
``/lib/modules/$(uname -r)/`` (the stand-in driver packages install such files), and
it fails with kmod's exact messages otherwise, so product code and its parsers meet
the same text as on real hardware.

A module file the simulated ``dkms`` built has a record in ``dkms.json`` (``labkernel``): modprobe
inserts it only when it was built for the running kernel and every symbol it was linked against is
exported, with the same CRC, by a loaded module; otherwise it fails with kmod's message and writes the
kernel's lines to the node's log, which ``dmesg`` prints.  A file without a record loads as before.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

sys.path.insert(0, os.environ.get("PROVISIONER_LAB_LIB", "/usr/lib/provisioner-lab"))

if TYPE_CHECKING:
    from provisioner.lab.simtools import labkernel, labstate
else:
    try:  # inside a node: the flat copy next to this script's library dir
        import labkernel
        import labstate
    except ImportError:  # on the host (tests): the package copy
        from provisioner.lab.simtools import labkernel, labstate

MODULE_SUFFIXES = (".ko", ".ko.xz", ".ko.zst", ".ko.gz")

DEPENDS = labkernel.DEPENDS

SIZES: dict[str, int] = {
    "mlx5_core": 2342912,
    "mlx5_ib": 458752,
    "ib_core": 462848,
    "ib_uverbs": 184320,
    "ib_umad": 40960,
    "ib_ipoib": 151552,
    "nvidia": 56823808,
    "nvidia_uvm": 4657152,
    "nvidia_modeset": 1466368,
    "nvidia_drm": 90112,
    "nvidia_peermem": 16384,
}
DEFAULT_SIZE = 16384


def normalise(name: str) -> str:
    """Module names treat ``-`` and ``_`` alike; the kernel reports ``_``."""
    return name.replace("-", "_")


def modules_dir() -> str:
    """``/lib/modules/<running kernel>``; tests point it elsewhere."""
    return os.environ.get("PROVISIONER_LAB_MODULES_DIR") or os.path.join(
        labkernel.sysroot(), "lib/modules", labkernel.running_kernel())


def find_module_file(directory: str, name: str) -> str | None:
    """Path of the module file for ``name`` anywhere under ``directory``, or None."""
    wanted = normalise(name)
    for current, _dirs, files in os.walk(directory):
        for filename in sorted(files):
            for suffix in MODULE_SUFFIXES:
                if filename.endswith(suffix) and normalise(filename[: -len(suffix)]) == wanted:
                    return os.path.join(current, filename)
    return None


def holders(loaded: list[str], name: str) -> list[str]:
    """Loaded modules that use ``name`` (lsmod's "Used by" list)."""
    return [m for m in loaded if name in DEPENDS.get(m, ())]


def lsmod_text(loaded: list[str]) -> str:
    """kmod's lsmod layout: ``%-19s %8lu  %d`` then the holders, comma separated."""
    lines = ["Module                  Size  Used by"]
    for name in loaded:
        users = holders(loaded, name)
        line = f"{name:<19} {SIZES.get(name, DEFAULT_SIZE):>8}  {len(users)}"
        if users:
            line += " " + ",".join(users)
        lines.append(line)
    return "\n".join(lines) + "\n"


class Failure(Exception):
    """A message for stderr and an exit status, as the real tool gives them."""

    def __init__(self, message: str, status: int = 1, loaded: list[str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.loaded = loaded  # what stays loaded (dependencies inserted before the failing module)


class Kernel:
    """What the running kernel knows when it inserts a module: its release, the DKMS records, where
    each loaded module came from, and the log lines it writes."""

    def __init__(self, release: str, records: dict[str, dict[str, Any]], builds: dict[str, dict[str, Any]]) -> None:
        self.release = release
        self.records = records
        self.builds = builds
        self.log: list[str] = []


def load(loaded: list[str], name: str, directory: str, *, first_time: bool = False, dry_run: bool = False,
         verbose: list[str] | None = None, kernel: Kernel | None = None) -> list[str]:
    """New loaded list after ``modprobe name``; dependencies first, newest at the front."""
    name = normalise(name)
    if name in loaded:
        if first_time:
            raise Failure(f"modprobe: ERROR: could not insert '{name}': Module already in kernel")
        return loaded
    path = find_module_file(directory, name)
    if path is None:
        raise Failure(f"modprobe: FATAL: Module {name} not found in directory {directory}")
    record = kernel.records.get(path) if kernel is not None else None
    depends = record.get("depends") if record is not None else None
    result = list(loaded)
    for dep in (depends if isinstance(depends, list) else DEPENDS.get(name, ())):
        if dep not in result and find_module_file(directory, dep) is not None:
            result = load(result, dep, directory, dry_run=dry_run, verbose=verbose, kernel=kernel)
    if verbose is not None:
        verbose.append(f"insmod {path} ")
    if dry_run:
        return result
    if kernel is not None and record is not None:
        exported = labkernel.loaded_exports(result, kernel.builds, kernel.release)
        refused = labkernel.insert_failure(name, record, kernel.release, exported)
        if refused is not None:
            errno, lines = refused
            kernel.log.extend(lines)
            raise Failure(f"modprobe: ERROR: could not insert '{name}': {labkernel.KMOD_ERRORS[errno]}",
                          loaded=result)
        kernel.builds[name] = labkernel.loaded_build(record)
    return [name, *result]


def unload(loaded: list[str], name: str, tool: str, *, first_time: bool = False) -> list[str]:
    """New loaded list after ``rmmod name`` / ``modprobe -r name``."""
    name = normalise(name)
    if name not in loaded:
        if tool == "rmmod":
            raise Failure(f"rmmod: ERROR: Module {name} is not currently loaded")
        if first_time:
            raise Failure(f"modprobe: FATAL: Module {name} is not in kernel.")
        return loaded
    users = holders(loaded, name)
    if users:
        if tool == "rmmod":
            raise Failure(f"rmmod: ERROR: Module {name} is in use by: {' '.join(users)}")
        raise Failure(f"modprobe: FATAL: Module {name} is in use.")
    return [m for m in loaded if m != name]


def modprobe(argv: list[str], loaded: list[str], directory: str,
             kernel: Kernel | None = None) -> tuple[list[str], str]:
    """Run modprobe's logic on ``loaded``; return the new list and what to print."""
    remove = all_names = quiet = dry_run = first_time = False
    verbose: list[str] | None = None
    names: list[str] = []
    for arg in argv:
        if arg in ("-r", "--remove"):
            remove = True
        elif arg in ("-a", "--all"):
            all_names = True
        elif arg in ("-q", "--quiet"):
            quiet = True
        elif arg in ("-n", "--dry-run", "--show"):
            dry_run = True
        elif arg in ("-v", "--verbose"):
            verbose = []
        elif arg == "--first-time":
            first_time = True
        elif arg in ("-b", "--use-blacklist", "-s", "--syslog"):
            continue
        elif arg.startswith("-"):
            raise Failure(f"modprobe: ERROR: unrecognized option '{arg}'")
        else:
            names.append(arg)
    if not names:
        raise Failure("modprobe: ERROR: missing parameters. See -h.")
    targets = names if (all_names or remove) else names[:1]  # later words are module parameters
    try:
        for name in targets:
            if remove:
                loaded = unload(loaded, name, "modprobe", first_time=first_time)
            else:
                loaded = load(
                    loaded, name, directory, first_time=first_time, dry_run=dry_run, verbose=verbose, kernel=kernel
                )
    except Failure as failure:
        if quiet:
            raise Failure("", 1, failure.loaded) from None
        raise
    return loaded, "\n".join(verbose) + "\n" if verbose else ""


def modinfo(argv: list[str], directory: str, kernel: Kernel) -> str:
    """kmod's ``modinfo [-F field | -n] name``: filename, depends, name and vermagic of the module file."""
    field: str | None = None
    names: list[str] = []
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("-F", "--field") and args:
            field = args.pop(0)
        elif arg in ("-n", "--filename"):
            field = "filename"
        elif arg.startswith("-"):
            raise Failure(f"modinfo: ERROR: unrecognized option '{arg}'")
        else:
            names.append(arg)
    if not names:
        raise Failure("modinfo: ERROR: missing module or filename.")
    lines: list[str] = []
    for name in names:
        path = find_module_file(directory, name)
        if path is None:
            raise Failure(f"modinfo: ERROR: Module {name} not found.")
        record = kernel.records.get(path, {})
        depends = record.get("depends", DEPENDS.get(normalise(name), ()))
        info = {"filename": path, "depends": ",".join(depends), "name": normalise(name),
                "vermagic": f"{record.get('kernel', kernel.release)}{labkernel.VERMAGIC_TAIL.rstrip()}"}
        if field is not None:
            lines.append(info.get(field, ""))
        else:
            lines += [f"{key + ':':<16}{value}" for key, value in info.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    """Entry point for all five names."""
    tool = os.path.basename(argv[0])
    root, host = labstate.lab_root(), labstate.this_host()
    if tool == "dmesg":
        sys.stdout.write(labkernel.read_dmesg(root, host))
        return 0
    loaded = labstate.load_modules(root, host)
    builds = labstate.load_module_builds(root, host)
    kernel = Kernel(labkernel.running_kernel(),
                    labkernel.installed_records(labkernel.load_dkms(root, host)), dict(builds))
    try:
        if tool == "lsmod":
            sys.stdout.write(lsmod_text(loaded))
            return 0
        if tool == "modinfo":
            sys.stdout.write(modinfo(argv[1:], modules_dir(), kernel))
            return 0
        if tool == "rmmod":
            names = [a for a in argv[1:] if not a.startswith("-")]
            if not names:
                raise Failure("rmmod: ERROR: missing module name.")
            new = loaded
            for name in names:
                new = unload(new, name, "rmmod")
        else:
            new, output = modprobe(argv[1:], loaded, modules_dir(), kernel)
            sys.stdout.write(output)
    except Failure as failure:
        labkernel.append_dmesg(root, host, kernel.log)
        if failure.loaded is not None and failure.loaded != loaded:
            labstate.save_modules(root, host, failure.loaded, kernel.builds)
        if str(failure):
            sys.stderr.write(str(failure) + "\n")
        return failure.status
    if new != loaded or kernel.builds != builds:
        labstate.save_modules(root, host, new, kernel.builds)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
