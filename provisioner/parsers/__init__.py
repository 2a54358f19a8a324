"""Output parsers: pure functions from a tool's captured text to a JSON-ready dict.

``PARSERS`` maps the tool names used by ``provision parse TOOL`` to their parser; ``parse``
is the single entry point that guarantees the contract the CLI relies on: a dict with
``tool`` and ``warnings``, or :class:`provisioner.errors.ParseError` with a one-line message
when the text is not that tool's output. No other exception escapes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from provisioner.errors import ParseError
from provisioner.parsers.dcgmi import parse_dcgmi_diag
from provisioner.parsers.iblinkinfo import parse_iblinkinfo
from provisioner.parsers.ibnetdiscover import parse_ibnetdiscover
from provisioner.parsers.ibqueryerrors import parse_ibqueryerrors
from provisioner.parsers.ibstat import parse_ibstat
from provisioner.parsers.ibstatus import parse_ibstatus
from provisioner.parsers.lspci import parse_lspci
from provisioner.parsers.nccl_tests import parse_nccl_tests
from provisioner.parsers.nvidia_topo import parse_nvidia_smi_topo
from provisioner.parsers.perftest import parse_perftest
from provisioner.parsers.small import (
    parse_ibdev2netdev,
    parse_lsmod,
    parse_ofed_info,
    parse_opensm_conf,
    parse_sminfo,
)

Parser = Callable[[str], dict[str, Any]]

PARSERS: dict[str, Parser] = {
    "ibstat": parse_ibstat,
    "ibstatus": parse_ibstatus,
    "perftest": parse_perftest,
    "ibdev2netdev": parse_ibdev2netdev,
    "nvidia-smi-topo": parse_nvidia_smi_topo,
    "nccl-tests": parse_nccl_tests,
    "iblinkinfo": parse_iblinkinfo,
    "ofed_info": parse_ofed_info,
    "lsmod": parse_lsmod,
    "opensm-conf": parse_opensm_conf,
    "sminfo": parse_sminfo,
    "ibnetdiscover": parse_ibnetdiscover,
    "ibqueryerrors": parse_ibqueryerrors,
    "lspci": parse_lspci,
    "dcgmi": parse_dcgmi_diag,
}

__all__ = ["PARSERS", "Parser", "parse"]


def parse(tool: str, text: str) -> dict[str, Any]:
    """Parse ``text`` as the output of ``tool``.

    Raises ParseError for an unknown tool or for text that is not that tool's output. A
    parser bug (any other exception) is also reported as ParseError so that the CLI's
    ``parse`` command never prints a traceback for bad input.
    """
    try:
        fn = PARSERS[tool]
    except KeyError:
        known = ", ".join(sorted(PARSERS))
        raise ParseError(f"unknown tool {tool!r} (known: {known})") from None
    try:
        return fn(text)
    except ParseError:
        raise
    except (ValueError, IndexError, KeyError, TypeError, OverflowError, RecursionError) as exc:
        raise ParseError(f"{tool}: could not parse input ({exc.__class__.__name__}: {exc})") from exc


def parse_capture(tool: str, file: str) -> dict[str, Any]:
    """`provision parse`: a captured output from ``file`` (``-``: standard input) parsed as ``tool``'s. An unknown
    tool or an input too large is a UsageError; stray bytes (a serial console) become U+FFFD for the parser."""
    import sys

    from provisioner.errors import UsageError
    from provisioner.userfile import MAX_USER_FILE_BYTES, read_user_bytes

    if tool not in PARSERS:
        raise UsageError(f"unknown tool '{tool}'", hint="one of " + ", ".join(sorted(PARSERS)))
    if file == "-":
        text = sys.stdin.read(MAX_USER_FILE_BYTES + 1)
        if len(text) > MAX_USER_FILE_BYTES:
            raise UsageError(f"standard input: more than {MAX_USER_FILE_BYTES} characters is too large for a "
                             "captured output")
    else:  # a capture may hold stray bytes (a serial console): they become U+FFFD, the parser judges the rest
        text = read_user_bytes(file, "a captured output").decode("utf-8", errors="replace")
    return parse(tool, text)
