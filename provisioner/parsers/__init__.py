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
