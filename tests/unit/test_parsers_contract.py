"""The registry contract: every parser returns a dict or raises ParseError, never anything else.

Covers the CLI's needs for ``provision parse TOOL FILE``: unknown tool, empty input, binary
input, another tool's output, and random text or bytes (hypothesis).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from provisioner.errors import ParseError
from provisioner.parsers import PARSERS, parse
from tests.unit._parser_fixtures import all_fixtures, load

TOOLS = sorted(PARSERS)
FIXTURES = all_fixtures()


def test_every_tool_has_fixtures() -> None:
    assert {tool for tool, _ in FIXTURES} == set(TOOLS)


def test_every_fixture_carries_a_source_header() -> None:
    from tests.unit._parser_fixtures import FIXTURES as ROOT

    for tool, name in FIXTURES:
        head = (ROOT / tool / name).read_text(encoding="utf-8").splitlines()[:3]
        assert any(line.startswith("# Source:") for line in head), f"{tool}/{name}"


@pytest.mark.parametrize(("tool", "name"), FIXTURES)
def test_own_fixture_parses_with_tool_and_warnings(tool: str, name: str) -> None:
    out = parse(tool, load(tool, name))
    assert isinstance(out["warnings"], list)
    assert out["tool"] == tool


@pytest.mark.parametrize(("tool", "name"), FIXTURES)
def test_crlf_line_endings_parse_the_same(tool: str, name: str) -> None:
    text = load(tool, name)
    lf = text.replace("\r\n", "\n")
    assert parse(tool, lf.replace("\n", "\r\n")) == parse(tool, lf) == parse(tool, text)


@pytest.mark.parametrize(("tool", "name"), FIXTURES)
def test_leading_spaces_parse_the_same(tool: str, name: str) -> None:
    # Pasted into a doc, a list item or a ticket, every line of an output gains the same indent.
    text = load(tool, name)
    indented = "".join("    " + line if line.strip() else line for line in text.splitlines(keepends=True))
    assert parse(tool, indented) == parse(tool, text)


def _contract_fixture_counts() -> dict[str, int]:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "parse-contract.md").read_text(encoding="utf-8")
    section = doc.split("## Tools and fields", 1)[1].split("\n## ", 1)[0]
    counts: dict[str, int] = {}
    for row in section.splitlines():
        cells = [c.strip(" `") for c in row.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0] in PARSERS and cells[-1].isdigit():
            counts[cells[0]] = int(cells[-1])
    return counts


def test_contract_table_lists_every_tool_with_its_real_capture_count() -> None:
    on_disk = {tool: sum(1 for t, _ in FIXTURES if t == tool) for tool in TOOLS}
    assert _contract_fixture_counts() == on_disk


CROSS = [(tool, other, name) for tool in TOOLS for other, name in FIXTURES if other != tool]


@pytest.mark.parametrize(("tool", "other", "name"), CROSS)
def test_other_tools_output_is_rejected(tool: str, other: str, name: str) -> None:
    with pytest.raises(ParseError) as exc:
        parse(tool, load(other, name))
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize("text", ["", "   \n\t\n", "\x00\x01\x02binary"])
def test_empty_and_binary_input_is_rejected(tool: str, text: str) -> None:
    with pytest.raises(ParseError):
        parse(tool, text)


def test_unknown_tool_names_the_known_ones() -> None:
    with pytest.raises(ParseError, match=r"known: .*ibstat"):
        parse("ibstatx", "CA 'mlx5_0'")


def _only_result_or_parse_error(tool: str, text: str) -> None:
    try:
        out = parse(tool, text)
    except ParseError as exc:
        assert str(exc)
        return
    assert out["tool"] == tool
    assert isinstance(out["warnings"], list)


@settings(max_examples=150, deadline=None)
@given(tool=st.sampled_from(TOOLS), text=st.text(max_size=400))
def test_random_text_never_crashes(tool: str, text: str) -> None:
    _only_result_or_parse_error(tool, text)


@settings(max_examples=150, deadline=None)
@given(tool=st.sampled_from(TOOLS), data=st.binary(max_size=400))
def test_random_bytes_never_crash(tool: str, data: bytes) -> None:
    _only_result_or_parse_error(tool, data.decode("utf-8", errors="replace"))


_SNIPPETS = [
    "CA 'mlx5_0'",
    "\tPort 1:",
    "\t\tState: Down",
    "\t\tRate: 400",
    "Infiniband device 'x' port 1 status:",
    "\trate:\t 200 Gb/sec (2X NDR)",
    " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]",
    " 65536 5000 97.1 96.9 0.18",
    "RDMA_Write BW Test",
    "#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong",
    " 8 2 float sum -1 1.0 0.0 0.0 0 1.0 0.0 0.0 0",
    "        GPU0    NIC0    CPU Affinity",
    "GPU0     X      PIX     0-1",
    "  NIC0: mlx5_0",
    "mlx5_0 port 1 ==> ib0 (Up)",
    "Module Size Used by",
    "ib_core 1 2 a,b",
    "routing_engine ar_updn",
    "sminfo: sm lid 1 sm guid 0x1, activity count 2 priority 3 state 3 SMINFO_MASTER",
    "MLNX_OFED_LINUX-1:",
    '   2    1[  ] ==( 4X 53.125 Gbps Active/  LinkUp)==>  3  4[  ] "x" ( )',
    "ibpanic: [1] main: x",
    "{",
    'Switch  8 "S-0008f10400410015"  # "SW" base port 0 lid 3 lmc 0',
    '[1]  "S-005442ba00003080"[10]  # "ISR" lid 6 1xSDR',
    'Ca  2 "H-1"  # "x"',
    '[1](1)  "S-2"[6]  # lid 16 lmc 1 "S" lid 3 4xQQQ',
    '{"results": [1, {"size": 3}]}',
    "# Avg bus bandwidth : nan",
]


@settings(max_examples=200, deadline=None)
@given(tool=st.sampled_from(TOOLS), lines=st.lists(st.sampled_from(_SNIPPETS) | st.text(max_size=30), max_size=12))
def test_mixed_real_looking_lines_never_crash(tool: str, lines: list[str]) -> None:
    _only_result_or_parse_error(tool, "\n".join(lines))
