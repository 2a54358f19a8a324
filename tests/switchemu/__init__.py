"""A test-only SSH switch emulator (MLNX-OS and NVUE shells) that netmiko talks to for real on 127.0.0.1."""

from tests.switchemu.server import EmuSwitch, SwitchEmulator

__all__ = ["EmuSwitch", "SwitchEmulator"]
