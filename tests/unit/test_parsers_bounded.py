"""Issue #26 item 5: `parse FILE` reads up to 16 MiB, so every parser must take time linear in its input. A regex
that backtracks over a long line (`\\S+.*\\b...` in perftest, `.*\\bibstat: .*failed` in ibstat) hung `parse`
on one long line: perftest took 43 s on 40,000 characters and grows with the cube of the length."""

from __future__ import annotations

import subprocess
import sys

import pytest

from provisioner.parsers import PARSERS

GUARD_S = 120
# one line of each shape, 1 MiB: a word, words, the ibstat error prefix over and over, a number
PROBE = """
import time
from provisioner.errors import ParseError
from provisioner.parsers import parse
n = 1024 * 1024
for shape in ("x", "x ", "ibstat: ", "Latency ", "9"):
    text = shape * (n // len(shape)) + "\\n"
    t = time.monotonic()
    try:
        parse({tool!r}, text)
    except ParseError:
        pass
    print(shape.strip() or "space", round(time.monotonic() - t, 2), flush=True)
"""


@pytest.mark.parametrize("tool", sorted(PARSERS))
def test_a_long_line_is_parsed_in_linear_time(tool: str) -> None:
    try:
        cp = subprocess.run([sys.executable, "-c", PROBE.format(tool=tool)], capture_output=True, text=True,
                            timeout=GUARD_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{tool}: one 1 MiB line took over {GUARD_S} s (so far: {exc.stdout!r})")
    assert cp.returncode == 0, cp.stderr
    assert len(cp.stdout.splitlines()) == 5, cp.stdout
