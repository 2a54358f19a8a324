"""The simulated DKMS, modprobe and openibd: what a module was built against decides whether it loads.

Runs the node tools on the host against a temporary lab root and system root (``PROVISIONER_LAB_ROOT``,
``PROVISIONER_LAB_SYSROOT``, ``PROVISIONER_LAB_KERNEL``).  The sources are the stand-in packages' own
dkms.conf files; the steps are what the packages' postinst/prerm and the roles do.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.lab.nodetools import dkms_sim, kmod_sim
from provisioner.lab.packages import VendorVersions, driver_recipes, ofed_recipes
from provisioner.lab.simtools import labkernel, labstate

KERNEL = "6.1.0-21-amd64"
HOST = "gpu01"
SIMTOOLS = Path(labstate.__file__).parent
PINNED = VendorVersions()
NEWER_OFED = VendorVersions(ofed="25.01-0.6.0.0", doca="2.10.0")
NVIDIA = ("nvidia", "550.90.07")
OFED = ("mlnx-ofed-kernel", "24.10.OFED.24.10.1.1.4.0")
OFED_NEW = ("mlnx-ofed-kernel", "25.01.OFED.25.01.0.6.0.0")


@pytest.fixture()
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A lab root with one node (inbox RDMA stack loaded), a system root with the running kernel's headers,
    the stand-in dkms.conf files of the pinned driver and of two OFED releases, and the simulated tools on PATH."""
    lab, sysroot, bin_dir = tmp_path / "lab", tmp_path / "sysroot", tmp_path / "bin"
    (lab / "nodes" / HOST).mkdir(parents=True)
    labstate.save_modules(str(lab), HOST, list(labstate.DEFAULT_MODULES))
    (sysroot / "lib/modules" / KERNEL / "build/include").mkdir(parents=True)
    recipes = [*driver_recipes(PINNED), *ofed_recipes(PINNED), *ofed_recipes(NEWER_OFED)]
    for recipe in recipes:
        for entry in recipe.files:
            if entry.path.startswith("/usr/src/"):
                dest = sysroot / entry.path.lstrip("/")
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(entry.content)
    bin_dir.mkdir()
    for name in ("modprobe", "rmmod", "lsmod", "modinfo", "dmesg"):  # as the image's lab layer installs them
        (bin_dir / name).write_bytes(Path(kmod_sim.__file__).read_bytes())
        (bin_dir / name).chmod(0o755)
    (tmp_path / "proc").mkdir()  # the node's processes (openibd's pgrep): none unless a test starts one
    env = {"PROVISIONER_LAB_ROOT": str(lab), "PROVISIONER_LAB_HOST": HOST, "PROVISIONER_LAB_KERNEL": KERNEL,
           "PROVISIONER_LAB_SYSROOT": str(sysroot), "PROVISIONER_LAB_LIB": str(SIMTOOLS),
           "PROVISIONER_LAB_PROC": str(tmp_path / "proc"), "PATH": f"{bin_dir}:/usr/bin:/bin"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("PROVISIONER_LAB_MODULES_DIR", raising=False)
    return tmp_path


def dkms(*args: str) -> tuple[int, str]:
    return dkms_sim.run(list(args))


def install(name_version: tuple[str, str]) -> None:
    """What a ``*-dkms`` package's postinst does for the running kernel."""
    name, version = name_version
    assert dkms("add", "-m", name, "-v", version)[0] == 0
    assert dkms("build", "-m", name, "-v", version, "-k", KERNEL)[0] == 0
    status, text = dkms("install", "-m", name, "-v", version, "-k", KERNEL)
    assert status == 0, text


def remove(name_version: tuple[str, str]) -> None:
    """What a ``*-dkms`` package's prerm does."""
    assert dkms("remove", "-m", name_version[0], "-v", name_version[1], "--all")[0] == 0


def tool(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """A simulated tool as a process, found on PATH like openibd finds it."""
    return subprocess.run([sys.executable, str(Path(os.environ["PATH"].split(":")[0]) / name), *args],
                          capture_output=True, text=True, check=False, env=dict(os.environ))


def openibd(action: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SIMTOOLS / "openibd"), action], capture_output=True, text=True,
                          check=False, env=dict(os.environ))


def loaded() -> list[str]:
    return labstate.load_modules(os.environ["PROVISIONER_LAB_ROOT"], HOST)


def test_driver_built_before_ofed_gives_a_peermem_that_returns_einval(node: Path) -> None:
    install(NVIDIA)  # the old phase order: gpu_stack (driver) before ofed
    install(OFED)
    assert openibd("restart").returncode == 0
    record = labkernel.installed_records(labkernel.load_dkms(str(node / "lab"), HOST))
    peermem = next(r for r in record.values() if r["module"] == "nvidia_peermem")
    assert peermem["init"] == "einval" and peermem["peer_memory"] is None and peermem["kernel"] == KERNEL
    done = tool("modprobe", "nvidia_peermem")
    assert done.returncode == 1
    assert done.stderr == "modprobe: ERROR: could not insert 'nvidia_peermem': Invalid argument\n"
    assert "nvidia_peermem" not in loaded() and "nvidia" in loaded()  # the dependency stays, as with kmod
    assert "nvidia_peermem" not in tool("dmesg").stdout  # the stub's init fails silently
    assert tool("modinfo", "-F", "depends", "nvidia_peermem").stdout == "nvidia\n"  # no ib_uverbs: a stub


def test_ofed_before_driver_gives_a_peermem_that_loads(node: Path) -> None:
    install(OFED)
    symvers = node / "sysroot/usr/src/ofa_kernel/default/Module.symvers"
    assert "\tib_register_peer_memory_client\tdrivers/infiniband/core/ib_uverbs\tEXPORT_SYMBOL\t" in symvers.read_text()
    restarted = openibd("restart")
    assert restarted.returncode == 0, restarted.stdout
    assert restarted.stdout.endswith("Loading HCA driver and Access Layer: [  OK  ]\n")  # text mode reads \r\n as \n
    builds = labstate.load_module_builds(str(node / "lab"), HOST)
    assert builds["ib_uverbs"]["dkms"] == "/".join(OFED) and builds["ib_uverbs"]["kernel"] == KERNEL
    install(NVIDIA)
    done = tool("modprobe", "nvidia_peermem")
    assert done.returncode == 0, done.stderr
    assert loaded()[0] == "nvidia_peermem"
    assert tool("modinfo", "-F", "depends", "nvidia_peermem").stdout == "nvidia,ib_uverbs\n"
    lsmod = tool("lsmod").stdout
    assert any(line.startswith("ib_uverbs") and line.endswith("nvidia_peermem") for line in lsmod.splitlines())


def test_peermem_against_an_ofed_that_is_not_loaded_misses_its_symbols(node: Path) -> None:
    install(OFED)
    install(NVIDIA)  # OFED installed, but openibd never restarted: the kernel's own ib_uverbs is loaded
    done = tool("modprobe", "nvidia_peermem")
    assert done.stderr == ("modprobe: ERROR: could not insert 'nvidia_peermem': "
                           "Unknown symbol in module, or unknown parameter (see dmesg)\n")
    assert "] nvidia_peermem: Unknown symbol ib_register_peer_memory_client (err -2)" in tool("dmesg").stdout


def test_openibd_refuses_to_stop_under_a_loaded_peermem_and_a_new_ofed_needs_a_rebuild(node: Path) -> None:
    install(OFED)
    assert openibd("restart").returncode == 0
    install(NVIDIA)
    assert tool("modprobe", "nvidia_peermem").returncode == 0
    remove(OFED)  # apt upgrade of the OFED stack: old prerm, new postinst
    install(OFED_NEW)
    refused = openibd("restart")
    assert refused.returncode == 1
    assert refused.stdout == ("Unloading ib_uverbs[FAILED]\n"
                              "rmmod: ERROR: Module ib_uverbs is in use by: nvidia_peermem\n")
    assert "nvidia_peermem" in loaded()
    # systemd runs ExecStart after a failed ExecStop; start finds the old build loaded and stops first: same refusal
    started = openibd("start")
    assert (started.returncode, started.stdout) == (1, refused.stdout)
    assert tool("rmmod", "nvidia_peermem").returncode == 0
    assert openibd("restart").returncode == 0
    stale = tool("modprobe", "nvidia_peermem")
    assert stale.stderr == "modprobe: ERROR: could not insert 'nvidia_peermem': Invalid argument\n"
    log = tool("dmesg").stdout
    assert "] nvidia_peermem: disagrees about version of symbol ib_register_peer_memory_client\n" in log
    assert "] nvidia_peermem: Unknown symbol ib_register_peer_memory_client (err -22)\n" in log
    # dkms install of an installed module is a no-op: the rebuild is remove + install
    assert "already installed" in dkms("install", "-m", "nvidia", "-v", "550.90.07", "-k", KERNEL)[1]
    assert dkms("remove", "-m", "nvidia", "-v", "550.90.07", "-k", KERNEL)[0] == 0
    install(NVIDIA)
    assert tool("modprobe", "nvidia_peermem").returncode == 0
    status = dkms("status")[1]
    assert f"nvidia/550.90.07, {KERNEL}, x86_64: installed" in status
    assert f"mlnx-ofed-kernel/25.01.OFED.25.01.0.6.0.0, {KERNEL}, x86_64: installed" in status


def run_process(node: Path, pid: int, name: str) -> Path:
    """A process named ``name`` on the node, as /proc/<pid>/comm shows it."""
    entry = node / "proc" / str(pid)
    entry.mkdir()
    (entry / "comm").write_text(name + "\n")
    return entry


REFUSED_FOR_OPENSM = ('Please stop "opensm" and all applications running over InfiniBand.\n\n'
                      "Error: Cannot unload the Infiniband driver stack due to the above issue(s)!\n\n"
                      "Once the above issue(s) resolved, run:\n")


def test_openibd_refuses_to_stop_while_opensm_runs_or_lustre_is_loaded(node: Path) -> None:
    install(OFED)
    assert openibd("restart").returncode == 0
    sm = run_process(node, 812, "opensm")
    before = loaded()
    refused = openibd("restart")
    # mod_load_funcs check_if_ok_to_stop: the Debian init script's run mode is always manual, so it always checks
    assert refused.returncode == 1
    assert refused.stdout.startswith(REFUSED_FOR_OPENSM) and refused.stdout.endswith(" restart\n")
    assert loaded() == before  # nothing was unloaded
    # a new OFED: start finds the old build loaded, stops first, and is refused the same way
    remove(OFED)
    install(OFED_NEW)
    started = openibd("start")
    assert started.returncode == 1 and started.stdout.startswith(REFUSED_FOR_OPENSM)
    (sm / "comm").unlink()
    sm.rmdir()
    run_process(node, 900, "sshd")  # other processes do not block
    assert openibd("start").returncode == 0
    labstate.save_modules(str(node / "lab"), HOST, [*loaded(), "ko2iblnd"])
    lustre = openibd("stop")
    assert lustre.returncode == 1
    assert lustre.stdout.startswith("Please stop Lustre services before unloading the Infiniband stack.\n\nError:")


def test_no_headers_no_build(node: Path) -> None:
    (node / "sysroot/lib/modules" / KERNEL / "build/include").rmdir()
    status, text = dkms("build", "-m", OFED[0], "-v", OFED[1], "-k", KERNEL)
    assert status == 21
    assert text.endswith(f"\nError! Your kernel headers for kernel {KERNEL} cannot be found at "
                         f"/lib/modules/{KERNEL}/build or /lib/modules/{KERNEL}/source.\n"
                         f"Please install the linux-headers-{KERNEL} package or use the --kernelsourcedir option "
                         "to tell DKMS where it's located.\n")
    assert "mlnx-ofed-kernel/24.10.OFED.24.10.1.1.4.0: added" in dkms("status")[1]
    started = openibd("restart")  # nothing OFED-built to load: openibd fails like the real one
    assert started.returncode == 1 and "Loading HCA driver and Access Layer: [FAILED]" in started.stdout


def test_a_module_built_for_another_kernel_is_refused(node: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install(NVIDIA)
    other = "6.1.0-22-amd64"
    built = node / "sysroot/lib/modules" / KERNEL
    (built.parent / other).mkdir()
    (built / "updates").rename(built.parent / other / "updates")  # as if booted into a newer kernel
    data = labkernel.load_dkms(str(node / "lab"), HOST)
    for build in data["builds"].values():
        for record in build["modules"].values():
            record["installed"] = record["installed"].replace(f"/{KERNEL}/", f"/{other}/")
    labkernel.save_dkms(str(node / "lab"), HOST, data)
    monkeypatch.setenv("PROVISIONER_LAB_KERNEL", other)
    done = tool("modprobe", "nvidia")
    assert done.stderr == "modprobe: ERROR: could not insert 'nvidia': Exec format error\n"
    assert (f"] nvidia: version magic '{KERNEL} SMP preempt mod_unload modversions ' should be "
            f"'{other} SMP preempt mod_unload modversions '") in tool("dmesg").stdout


def test_records_survive_a_fault_that_drops_one_module(node: Path) -> None:
    install(OFED)
    assert openibd("restart").returncode == 0
    lab = str(node / "lab")
    labstate.save_modules(lab, HOST, [m for m in labstate.load_modules(lab, HOST) if m != "ib_ipoib"])
    builds = labstate.load_module_builds(lab, HOST)
    assert "ib_ipoib" not in builds and builds["ib_core"]["dkms"] == "/".join(OFED)
