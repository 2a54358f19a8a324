#!/usr/bin/python3
"""Simulated ``dkms`` for lab nodes (stdlib only): builds that record what they were built against.

A lab node has no compiler and shares the host's kernel, so DKMS cannot really build.  This stand-in
(``/usr/local/sbin/dkms`` in the image's lab layer) keeps DKMS's interface and its decisions:

* a source is ``/usr/src/<name>-<version>/dkms.conf`` (the stand-in ``*-dkms`` packages ship one in the
  real format: ``PACKAGE_NAME``, ``PACKAGE_VERSION``, ``BUILT_MODULE_NAME[i]``, ``MAKE``, ``AUTOINSTALL``);
* building needs the kernel headers: ``/lib/modules/<kernel>/build/include`` (dkms's ``_check_kernel_dir``),
  else dkms's exit 21 and its message;
* a build of mlnx-ofed-kernel (its ``MAKE`` runs ``ofed_scripts/pre_build.sh``) leaves its
  ``Module.symvers`` in ``/usr/src/ofa_kernel/<arch>/<kernel>`` and points ``/usr/src/ofa_kernel/default``
  at it, as ``ofed_scripts/dkms_ofed_post_build.sh`` does;
* a build of nvidia_peermem looks for ``ib_register_peer_memory_client`` and
  ``ib_unregister_peer_memory_client`` in the places NVIDIA's conftest (``ib_peer_memory_symbols``) looks;
  without them the module is built with an init that returns -EINVAL (``NV_MLNX_IB_PEER_MEM_SYMBOLS_PRESENT``
  undefined);
* every built module gets a record in the lab state (``nodes/<host>/dkms.json``): kernel, symbols it needs
  with their CRC, symbols it exports, where it was installed.  The simulated modprobe checks those records.

Actions: ``status``, ``add``, ``build``, ``install``, ``remove`` (``-k``/``--all``), ``autoinstall``; the
module as ``name/version`` or ``-m name -v version``; ``-k kernel``, ``--force``.  Messages and exit codes
are dkms 3.x's (github.com/dell/dkms ``dkms.in``).  Tests: ``PROVISIONER_LAB_SYSROOT``,
``PROVISIONER_LAB_KERNEL``, ``PROVISIONER_LAB_ROOT``/``_HOST``, ``PROVISIONER_LAB_LIB``.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from typing import TYPE_CHECKING, Any

sys.path.insert(0, os.environ.get("PROVISIONER_LAB_LIB", "/usr/lib/provisioner-lab"))

if TYPE_CHECKING:
    from provisioner.lab.simtools import labkernel, labstate
else:
    try:  # inside a node: the flat copies in /usr/lib/provisioner-lab
        import labkernel
        import labstate
    except ImportError:  # on the host (tests): the package copies
        from provisioner.lab.simtools import labkernel, labstate

SYMVERS_SEARCH = ("usr/src/ofa_kernel/{arch}/{kernel}", "usr/src/ofa_kernel/{kernel}", "usr/src/ofa_kernel/default")
"""Where NVIDIA's conftest looks for MLNX_OFED's Module.symvers after the kernel's own build dir."""


class DkmsError(Exception):
    def __init__(self, status: int, *lines: str) -> None:
        super().__init__("\n".join(lines))
        self.status = status


def _p(*parts: str) -> str:
    return os.path.join(labkernel.sysroot(), *[p.lstrip("/") for p in parts])


# ---------------------------------------------------------------- dkms.conf


def read_conf(name: str, version: str) -> dict[str, Any]:
    """The module's dkms.conf: plain and indexed (``KEY[i]``) assignments."""
    path = _p("usr/src", f"{name}-{version}", "dkms.conf")
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        raise DkmsError(4, "Could not locate dkms.conf file.", f"File: {path} does not exist.") from None
    conf: dict[str, Any] = {"modules": []}
    for line in text.splitlines():
        m = re.match(r'^\s*([A-Z_]+)(?:\[(\d+)\])?=(.*)$', line)
        if not m:
            continue
        key, index, value = m.group(1), m.group(2), m.group(3).strip().strip('"')
        if key == "BUILT_MODULE_NAME" and index is not None:
            conf["modules"].append(value.replace("-", "_"))
        elif index is None:
            conf[key] = value
    if not conf["modules"]:
        raise DkmsError(8, "Bad conf file.", f"File: {path} does not represent a valid dkms.conf file.")
    return conf


# ---------------------------------------------------------------- building (what the records say)


def headers_present(kernel: str) -> bool:
    return os.path.exists(_p("lib/modules", kernel, "build", "include"))


def find_peer_symvers(kernel: str) -> tuple[str, dict[str, str]] | None:
    """The first Module.symvers exporting both peer-memory symbols, in NVIDIA's conftest order."""
    dirs = [_p("lib/modules", kernel, "build")] + [_p(d.format(arch=labkernel.ARCH, kernel=kernel))
                                                   for d in SYMVERS_SEARCH]
    tree = _p("var/lib/dkms/mlnx-ofed-kernel")
    if os.path.isdir(tree):
        dirs += sorted(os.path.join(tree, v, "build") for v in os.listdir(tree))
    for directory in dirs:
        found: dict[str, str] = {}
        try:
            with open(os.path.join(directory, "Module.symvers"), encoding="utf-8") as handle:
                for line in handle:
                    cols = line.rstrip("\n").split("\t")
                    peer = len(cols) >= 4 and cols[1] in labkernel.PEER_MEMORY_SYMBOLS
                    if peer and cols[3].startswith("EXPORT_SYMBOL"):
                        found[cols[1]] = cols[0]
        except OSError:
            continue
        if set(found) == set(labkernel.PEER_MEMORY_SYMBOLS):
            return os.path.join(directory, "Module.symvers"), found
    return None


def module_records(name: str, version: str, conf: dict[str, Any], kernel: str) -> dict[str, dict[str, Any]]:
    """What building ``name/version`` for ``kernel`` produces, per module (pure apart from the conftest read)."""
    build = f"{name}/{version}"
    modules: list[str] = conf["modules"]
    ofed_compat = "mlx_compat" in modules
    out: dict[str, dict[str, Any]] = {}
    for mod in modules:
        depends = list(labkernel.DEPENDS.get(mod, ()))
        if ofed_compat and mod != "mlx_compat":
            depends.append("mlx_compat")
        needs = {s: labkernel.crc(s, build)
                 for dep in depends if dep in modules for s in labkernel.EXPORTS.get(dep, ())}
        record: dict[str, Any] = {"module": mod, "depends": depends, "needs": needs, "init": "ok",
                                  "exports": {s: labkernel.crc(s, build) for s in labkernel.EXPORTS.get(mod, ())}}
        if mod == "nvidia_peermem":
            peer = find_peer_symvers(kernel)
            if peer is None:  # conftest: #undef NV_MLNX_IB_PEER_MEM_SYMBOLS_PRESENT
                record.update(depends=[d for d in depends if d != "ib_uverbs"], init="einval", peer_memory=None,
                              needs={s: c for s, c in needs.items() if s not in labkernel.PEER_MEMORY_SYMBOLS})
            else:
                symvers, crcs = peer
                record["needs"] = {**needs, **crcs}
                record["peer_memory"] = {"symvers": symvers, "crcs": crcs}
        out[mod] = record
    return out


def write_ofed_symvers(kernel: str, records: dict[str, dict[str, Any]]) -> str:
    """dkms_ofed_post_build.sh: Module.symvers to /usr/src/ofa_kernel/<arch>/<kernel>, ``default`` -> it."""
    directory = _p("usr/src/ofa_kernel", labkernel.ARCH, kernel)
    os.makedirs(directory, exist_ok=True)
    lines = [f"{c}\t{s}\tdrivers/infiniband/core/{mod}\tEXPORT_SYMBOL\t"
             for mod, rec in sorted(records.items()) for s, c in sorted(rec["exports"].items())]
    labstate.atomic_write(os.path.join(directory, "Module.symvers"), "\n".join(lines) + "\n")
    default = _p("usr/src/ofa_kernel/default")
    if os.path.islink(default) or os.path.exists(default):
        os.unlink(default)
    os.symlink(os.path.join(labkernel.ARCH, kernel), default)
    return directory


def drop_ofed_symvers(kernel: str) -> None:
    directory = _p("usr/src/ofa_kernel", labkernel.ARCH, kernel)
    shutil.rmtree(directory, ignore_errors=True)
    default = _p("usr/src/ofa_kernel/default")
    if os.path.islink(default) and os.readlink(default) == os.path.join(labkernel.ARCH, kernel):
        os.unlink(default)


# ---------------------------------------------------------------- actions


class Dkms:
    def __init__(self) -> None:
        self.root, self.host = labstate.lab_root(), labstate.this_host()
        self.data = labkernel.load_dkms(self.root, self.host)
        self.out: list[str] = []

    def save(self) -> None:
        labkernel.save_dkms(self.root, self.host, self.data)

    def key(self, name: str, version: str, kernel: str) -> str:
        return f"{name}/{version}/{kernel}"

    def added(self, name: str, version: str) -> bool:
        return os.path.islink(_p("var/lib/dkms", name, version, "source"))

    def add(self, name: str, version: str) -> None:
        read_conf(name, version)
        if self.added(name, version):
            return
        os.makedirs(_p("var/lib/dkms", name, version), exist_ok=True)
        os.symlink(f"/usr/src/{name}-{version}", _p("var/lib/dkms", name, version, "source"))
        self.out.append(f"Creating symlink /var/lib/dkms/{name}/{version}/source -> /usr/src/{name}-{version}")

    def build(self, name: str, version: str, kernel: str, force: bool) -> None:
        self.add(name, version)
        key = self.key(name, version, kernel)
        if key in self.data["builds"]:
            if not force:
                self.out.append(f"Module {name}/{version} already built for kernel {kernel} ({labkernel.ARCH}), "
                                "skip. You may override by specifying --force.")
                return
            self.uninstall(key)
            del self.data["builds"][key]
        if not headers_present(kernel):
            raise DkmsError(21, f"Your kernel headers for kernel {kernel} cannot be found at "
                                f"/lib/modules/{kernel}/build or /lib/modules/{kernel}/source.",
                            f"Please install the linux-headers-{kernel} package or use the --kernelsourcedir "
                            "option to tell DKMS where it's located.")
        conf = read_conf(name, version)
        records = module_records(name, version, conf, kernel)
        build: dict[str, Any] = {"dkms": f"{name}/{version}", "kernel": kernel, "arch": labkernel.ARCH,
                                 "state": "built", "modules": records}
        if "ofed_scripts/pre_build.sh" in conf.get("MAKE", ""):
            build["symvers"] = write_ofed_symvers(kernel, records)
        self.data["builds"][key] = build
        self.out += ["", "Building module(s)... done."]

    def install(self, name: str, version: str, kernel: str, force: bool) -> None:
        key = self.key(name, version, kernel)
        if key not in self.data["builds"]:
            self.build(name, version, kernel, False)
        build = self.data["builds"][key]
        if build["state"] == "installed":
            if not force:
                self.out.append(f"Module {name}/{version} already installed on kernel {kernel} "
                                f"({labkernel.ARCH}), skip. You may override by specifying --force.")
                return
            self.uninstall(key)
        dest = _p("lib/modules", kernel, "updates/dkms")
        os.makedirs(dest, exist_ok=True)
        for mod, record in sorted(build["modules"].items()):
            path = os.path.join(dest, f"{mod}.ko")
            labstate.atomic_write(path, f"provisioner lab stand-in: {mod} built by DKMS {name}/{version} "
                                        f"for {kernel}; its record is in dkms.json\n")
            record["installed"] = path
            self.out.append(f"Installing /lib/modules/{kernel}/updates/dkms/{mod}.ko")
        build["state"] = "installed"
        self.out.append("Running depmod... done.")

    def uninstall(self, key: str) -> None:
        build = self.data["builds"][key]
        for record in build["modules"].values():
            path = record.pop("installed", None)
            if path and os.path.exists(path):
                os.unlink(path)
        build["state"] = "built"

    def remove(self, name: str, version: str, kernels: list[str]) -> None:
        if not self.added(name, version) and not any(
                k.startswith(f"{name}/{version}/") for k in self.data["builds"]):
            raise DkmsError(3, f"The module/version combo: {name}/{version} is not located in the DKMS tree.")
        for key in [k for k in self.data["builds"] if k.startswith(f"{name}/{version}/")]:
            build = self.data["builds"][key]
            if kernels and build["kernel"] not in kernels:
                continue
            self.uninstall(key)
            if build.get("symvers"):
                drop_ofed_symvers(build["kernel"])
            del self.data["builds"][key]
            self.out.append(f"Module {name}/{version} for kernel {build['kernel']} ({labkernel.ARCH}).")
            self.out.append("Before uninstall, this module version was ACTIVE on this kernel.")
        if not any(k.startswith(f"{name}/{version}/") for k in self.data["builds"]):
            shutil.rmtree(_p("var/lib/dkms", name, version), ignore_errors=True)
            self.out.append(f"Deleting module {name}/{version} completely from the DKMS tree.")

    def status(self, name: str | None, version: str | None, kernel: str | None) -> None:
        combos = sorted(self.sources(name, version))
        for mod, ver in combos:
            builds = [b for k, b in sorted(self.data["builds"].items()) if k.startswith(f"{mod}/{ver}/")
                      and (kernel is None or b["kernel"] == kernel)]
            if not builds and kernel is None:
                self.out.append(f"{mod}/{ver}: added")
            for b in builds:
                self.out.append(f"{mod}/{ver}, {b['kernel']}, {b['arch']}: {b['state']}")

    def sources(self, name: str | None, version: str | None) -> set[tuple[str, str]]:
        found = {tuple(k.split("/")[:2]) for k in self.data["builds"]}
        tree = _p("var/lib/dkms")
        if os.path.isdir(tree):
            for mod in os.listdir(tree):
                for ver in os.listdir(os.path.join(tree, mod)) if os.path.isdir(os.path.join(tree, mod)) else []:
                    if self.added(mod, ver):
                        found.add((mod, ver))
        return {(m, v) for m, v in found if (name is None or m == name) and (version is None or v == version)}

    def autoinstall(self, kernel: str) -> None:
        for mod, ver in sorted(self.sources(None, None)):
            if not self.added(mod, ver) or read_conf(mod, ver).get("AUTOINSTALL", "").lower() != "yes":
                continue
            build = self.data["builds"].get(self.key(mod, ver, kernel))
            if build is None or build["state"] != "installed":
                self.install(mod, ver, kernel, False)


def parse(argv: list[str]) -> dict[str, Any]:
    if not argv:
        raise DkmsError(2, "No action was specified.")
    args: dict[str, Any] = {"action": argv[0], "name": None, "version": None, "kernels": [], "all": False,
                            "force": False}
    rest = list(argv[1:])
    while rest:
        arg = rest.pop(0)
        if arg in ("-m", "-v", "-k", "-a", "--arch", "--kernelver") and rest:
            value = rest.pop(0)
            key = {"-m": "name", "-v": "version", "-k": "kernel", "--kernelver": "kernel"}.get(arg)
            if key == "kernel":
                args["kernels"].append(value)
            elif key:
                args[key] = value
        elif arg == "--all":
            args["all"] = True
        elif arg == "--force":
            args["force"] = True
        elif arg in ("-q", "--quiet", "--no-depmod", "--no-initrd"):
            continue
        elif arg.startswith("-"):
            raise DkmsError(2, f"Unknown option: {arg}")
        else:
            name, _, version = arg.partition("/")
            args["name"], args["version"] = name, version or args["version"]
    return args


def run(argv: list[str]) -> tuple[int, str]:
    dkms = Dkms()
    try:
        args = parse(argv)
        action, name, version = args["action"], args["name"], args["version"]
        kernels = args["kernels"] or [labkernel.running_kernel()]
        if action == "status":
            dkms.status(name, version, args["kernels"][0] if args["kernels"] else None)
        elif action == "autoinstall":
            dkms.autoinstall(kernels[0])
        elif action in ("add", "build", "install", "remove"):
            if not name or not version:
                raise DkmsError(1, "Arguments <module> and <module-version> are not specified.",
                                f"Usage: {action} <module>/<module-version> or",
                                f"       {action} -m <module>/<module-version> or",
                                f"       {action} -m <module> -v <module-version>")
            if action == "add":
                dkms.add(name, version)
            elif action == "build":
                for kernel in kernels:
                    dkms.build(name, version, kernel, args["force"])
            elif action == "install":
                for kernel in kernels:
                    dkms.install(name, version, kernel, args["force"])
            else:
                dkms.remove(name, version, [] if args["all"] else kernels)
        else:
            raise DkmsError(2, f"Unknown action specified: {action}")
    except DkmsError as error:
        dkms.save()
        return error.status, "\n".join(dkms.out) + ("\n" if dkms.out else "") + "\nError! " + str(error) + "\n"
    dkms.save()
    return 0, "\n".join(dkms.out) + ("\n" if dkms.out else "")


def main(argv: list[str]) -> int:
    status, text = run(argv[1:])
    (sys.stderr if status else sys.stdout).write(text)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
