"""A self-contained HTML page a person can open from a CI artifact or mail: no script, no external fetch.

Every value that came from a node or the spec goes through :func:`html.escape` (node names, versions and
tool output are not trusted text). Colours are inline so the file renders the same anywhere.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Mapping

from provisioner.fabric.findings import CheckResult, Finding
from provisioner.report.model import VerifyReport, expected_versions, fraction

#: Above this many nodes a rail's full matrix (n² cells) is replaced by its worst pairs.
MAX_MATRIX_NODES = 128
WORST_PAIRS = 50
#: Cells under this fraction of line rate are outlined (the scheduler's default pass threshold).
LOW_FRACTION = 0.9
#: The page may not fetch or run anything: only its own inline styles apply.
_CSP = "default-src 'none'; style-src 'unsafe-inline'"

_CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#1b1f24;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #d0d7de}
h3{font-size:15px;margin:16px 0 6px}
.meta{color:#57606a}
.verdict{display:inline-block;padding:2px 10px;border-radius:4px;font-weight:600;color:#fff}
.v-PASS{background:#1a7f37}.v-FAIL{background:#cf222e}.v-INCOMPLETE{background:#9a6700}
table{border-collapse:collapse;margin:6px 0}th,td{border:1px solid #d0d7de;padding:3px 6px;text-align:left}
th{background:#f6f8fa;font-weight:600}
table.heat td,table.heat th{text-align:center;font-size:12px;padding:2px 4px;min-width:34px}
table.heat th.row{text-align:right}
td.bw{color:#000}td.bw[data-low]{font-weight:700;outline:2px solid #cf222e;outline-offset:-2px}
td.diag{background:#eaeef2;color:#8c959f}td.none{background:#fff;color:#8c959f}
.sev-error{color:#cf222e;font-weight:600}.sev-warning{color:#9a6700;font-weight:600}.sev-info{color:#57606a}
td.mismatch{background:#ffebe9;font-weight:600}td.missing{background:#fff8c5}
.legend span{display:inline-block;padding:1px 8px;margin-right:4px;border:1px solid #d0d7de}
ul.notes li{margin:2px 0}
"""


_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f]")


def _e(value: object) -> str:
    """Escape any value for element text and quoted attributes; None shows as an empty cell.

    Control characters (terminal colour codes in captured tool output) are dropped: they render as boxes.
    """
    return "" if value is None else html.escape(_CONTROL.sub("", str(value)), quote=True)


def _colour(frac: float | None) -> str:
    """Red below 50 % of line rate, through amber, to green at 90 % and above (the pass threshold)."""
    if frac is None:
        return "#ddf4ff"
    hue = max(0.0, min(1.0, (frac - 0.5) / 0.4)) * 120
    return f"hsl({hue:.0f},70%,72%)"


def _cell(a: str, b: str, rail: int, gbps: float | None, rate: float | None) -> str:
    if a == b:
        return '<td class="diag">—</td>'
    if gbps is None:
        return f'<td class="none" title="{_e(f"{a} ↔ {b}, rail {rail}: not measured")}">·</td>'
    frac = fraction(gbps, rate)
    share = f" = {frac:.0%} of {rate:g} Gb/s line rate" if frac is not None and rate else ""
    tip = f"{a} → {b}, rail {rail}: {gbps:.1f} Gb/s{share}"
    # Below the pass threshold the cell is also outlined, so the map does not rely on colour alone.
    low = ' data-low="1"' if frac is not None and frac < LOW_FRACTION else ""
    return (
        f'<td class="bw"{low} data-rail="{rail}" data-a="{_e(a)}" data-b="{_e(b)}" '
        f'style="background:{_colour(frac)}" title="{_e(tip)}">{gbps:.0f}</td>'
    )


def _matrix(rail: int, cells: Mapping[tuple[str, str], float], nodes: list[str], rate: float | None) -> str:
    head = "".join(f'<th scope="col">{_e(n)}</th>' for n in nodes)
    rows = []
    for a in nodes:
        tds = "".join(_cell(a, b, rail, cells.get((a, b), cells.get((b, a))), rate) for b in nodes)
        rows.append(f'<tr><th scope="row" class="row">{_e(a)}</th>{tds}</tr>')
    return (
        f'<table class="heat" id="heat-rail-{rail}"><thead><tr><th>server \\ client</th>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _worst(rail: int, cells: Mapping[tuple[str, str], float], rate: float | None) -> str:
    worst = sorted(cells.items(), key=lambda kv: (kv[1], kv[0]))[:WORST_PAIRS]
    rows = "".join(f"<tr><td>{_e(a)}</td><td>{_e(b)}</td>{_cell(a, b, rail, g, rate)}</tr>" for (a, b), g in worst)
    return (
        f'<p class="meta">{len(cells)} pairs on more than {MAX_MATRIX_NODES} nodes: the {len(worst)} '
        f"slowest are listed instead of the full matrix (all figures are in the JSON report).</p>"
        f'<table class="heat" id="heat-rail-{rail}"><thead><tr><th>server</th><th>client</th>'
        f"<th>Gb/s</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _heatmaps(report: VerifyReport) -> str:
    if not report.bandwidth:
        return "<p>No pairwise bandwidth was measured.</p>"
    legend = (
        '<p class="legend">Colour = fraction of line rate: '
        + "".join(f'<span style="background:{_colour(f)}">{f:.0%}</span>' for f in (0.5, 0.7, 0.8, 0.9, 1.0))
        + " · value in Gb/s · hover a cell for details · “·” = pair not measured (quick mode)</p>"
    )
    parts = [legend]
    for rail in sorted(report.bandwidth):
        cells = report.bandwidth[rail]
        rate = report.line_rate.get(rail)
        nodes = report.rail_nodes(rail)
        title = f"Rail {rail}" + (f" (line rate {rate:g} Gb/s)" if rate else " (line rate unknown)")
        body = _matrix(rail, cells, nodes, rate) if len(nodes) <= MAX_MATRIX_NODES else _worst(rail, cells, rate)
        parts.append(f"<h3>{_e(title)}</h3>{body}")
    return "".join(parts)


def _findings_table(findings: list[Finding]) -> str:
    if not findings:
        return "<p>No findings.</p>"
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "Severity",
            "Check",
            "Node",
            "Device",
            "Port",
            "Rail",
            "Peer",
            "Expected",
            "Observed",
            "Message",
            "Hint",
        )
    )
    rows = []
    for f in findings:
        cols = (f.check, f.node, f.device, f.port, f.rail, f.peer, f.expected, f.observed, f.message, f.hint)
        tds = "".join(f"<td>{_e(c)}</td>" for c in cols)
        rows.append(
            f'<tr class="finding" data-severity="{_e(f.severity)}">'
            f'<td class="sev-{_e(f.severity)}">{_e(f.severity)}</td>{tds}</tr>'
        )
    return f'<table id="findings"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _checks_table(checks: Iterable[CheckResult]) -> str:
    rows = []
    for c in sorted(checks, key=lambda c: (c.name, c.node or "")):
        status = "could not run" if not c.ran else ("skipped" if c.skipped is not None
                                                     else "pass" if c.passed else "fail")
        cls = {"pass": "sev-info", "fail": "sev-error", "could not run": "sev-warning",
               "skipped": "sev-warning"}[status]
        rows.append(
            f'<tr class="check"><td>{_e(c.name)}</td><td>{_e(c.node or "cluster")}</td>'
            f'<td class="{cls}">{status}</td><td>{len(c.findings)}</td><td>{_e(c.error or c.skipped)}</td></tr>'
        )
    return (
        '<table id="checks"><thead><tr><th>Check</th><th>Node</th><th>Result</th><th>Findings</th>'
        f"<th>Why not run / skipped</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _versions_table(versions: Mapping[str, Mapping[str, str]]) -> str:
    if not versions:
        return "<p>No versions were collected.</p>"
    expected = expected_versions(versions)
    comps = list(expected)
    head = "".join(f"<th>{_e(c)}</th>" for c in comps)
    common = "".join(f"<td>{_e(expected[c])}</td>" for c in comps)
    rows = [f'<tr class="expected"><th>most nodes</th>{common}</tr>']
    for node in sorted(versions):
        tds = []
        for comp in comps:
            got = versions[node].get(comp)
            if got is None:
                tds.append(f'<td class="missing" title="{_e(f"missing; most nodes have {expected[comp]}")}">—</td>')
            elif got != expected[comp]:
                tip = f"differs: most nodes have {expected[comp]}"
                tds.append(f'<td class="mismatch" title="{_e(tip)}">{_e(got)}</td>')
            else:
                tds.append(f"<td>{_e(got)}</td>")
        rows.append(f'<tr><th scope="row">{_e(node)}</th>{"".join(tds)}</tr>')
    return f'<table id="versions"><thead><tr><th>node</th>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def to_html(report: VerifyReport) -> str:
    """The full page: summary, findings, per-rail heatmaps, versions, per-check results, notes."""
    v = report.verdict
    summary = (
        f'<p><span class="verdict v-{v.label}">{v.label}</span> '
        f"{v.passed} passed · {v.failed} failed · {v.could_not_run} could not run · {v.skipped} skipped · "
        f"{v.errors} errors · {v.warnings} warnings — exit code {v.exit_code}</p>"
    )
    notes = (
        '<h2>Notes</h2><ul class="notes">' + "".join(f"<li>{_e(n)}</li>" for n in report.notes) + "</ul>"
        if report.notes
        else ""
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        f"<title>{_e(f'Fabric verification: {report.cluster}')}</title><style>{_CSS}</style></head><body>"
        f"<h1>Fabric verification: {_e(report.cluster)}</h1>"
        f'<p class="meta">started {_e(report.started.isoformat())} · '
        f"finished {_e(report.finished.isoformat())} · {report.duration_s:.0f} s</p>{summary}"
        f"<h2>Findings</h2>{_findings_table(report.findings())}"
        f"<h2>Pairwise bandwidth (ib_write_bw)</h2>{_heatmaps(report)}"
        f"<h2>Versions</h2>{_versions_table(report.versions)}"
        f"<h2>Checks</h2>{_checks_table(report.checks)}"
        f"{notes}</body></html>\n"
    )
