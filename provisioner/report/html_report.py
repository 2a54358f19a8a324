"""A self-contained HTML page a person can open from a CI artifact or mail: no script, no external fetch.

Every value that came from a node or the spec goes through :func:`html.escape` (node names, versions and
tool output are not trusted text). Colours are inline so the file renders the same anywhere.

Written to be read on a laptop (no horizontal scroll at 1280 px, whatever the cluster's size): findings are
grouped by node, the nodes with errors first and errors first within a node; info lines are folded away
(``<details>``); a long reason (an SSH error, a perftest failure) is printed once: findings of one node that
share it become one entry listing where, and a later mention elsewhere on the page links back to it. Wide
tables (a rail's bandwidth matrix) scroll inside their own box, never the page.
"""

from __future__ import annotations

import html
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence

from provisioner.fabric.findings import CheckResult, Finding
from provisioner.report import fabric_picture
from provisioner.report.model import VerifyReport, expected_versions, fraction, peer_versions
from provisioner.spec import hostlist

#: Above this many nodes a rail's full matrix (n² cells) is replaced by its worst pairs.
MAX_MATRIX_NODES = 128
WORST_PAIRS = 50
#: Cells under this fraction of line rate are outlined (the scheduler's default pass threshold).
LOW_FRACTION = 0.9
#: A reason at least this long is printed once on the page; further mentions link back to it.
LONG_REASON = 60
#: The page may not fetch or run anything: only its own inline styles apply.
_CSP = "default-src 'none'; style-src 'unsafe-inline'"

_CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#1b1f24;background:#fff;
max-width:1400px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #d0d7de}
h3{font-size:15px;margin:16px 0 6px}
.meta{color:#57606a}
.verdict{display:inline-block;padding:2px 10px;border-radius:4px;font-weight:600;color:#fff}
.v-PASS{background:#1a7f37}.v-FAIL{background:#cf222e}.v-INCOMPLETE{background:#9a6700}
table{border-collapse:collapse;margin:6px 0}th,td{border:1px solid #d0d7de;padding:3px 6px;text-align:left;
vertical-align:top;overflow-wrap:anywhere}
th{background:#f6f8fa;font-weight:600}
.scroll{overflow-x:auto;max-width:100%}
table.heat td,table.heat th{text-align:center;font-size:12px;padding:2px 4px;min-width:34px;overflow-wrap:normal}
table.heat th.row{text-align:right}
td.bw{color:#000}td.bw[data-low]{font-weight:700;outline:2px solid #cf222e;outline-offset:-2px}
td.diag{background:#eaeef2;color:#8c959f}td.none{background:#fff;color:#8c959f}
.sev-error{color:#cf222e;font-weight:600}.sev-warning{color:#9a6700;font-weight:600}.sev-info{color:#57606a}
.sev-notrun{color:#9a6700;font-weight:600}.sev-skipped{color:#57606a;font-weight:600}
span.mismatch{background:#ffebe9;font-weight:600}span.missing{background:#fff8c5}
.legend span{display:inline-block;padding:1px 8px;margin-right:4px;border:1px solid #d0d7de}
ul.notes li{margin:2px 0}
section.node{border:1px solid #d0d7de;border-radius:6px;padding:4px 12px 8px;margin:10px 0}
section.node h3{margin:6px 0}section.node h3 .meta{font-weight:400;font-size:13px}
ul.items{list-style:none;padding:0;margin:0}ul.items>li{margin:6px 0;padding-left:8px;border-left:3px solid #d0d7de}
ul.items>li[data-severity=error]{border-left-color:#cf222e}ul.items>li[data-severity=warning]{border-left-color:#d4a72c}
ul.items>li[data-severity=notrun]{border-left-color:#d4a72c}
.msg,.hint,.reason,.where li{overflow-wrap:anywhere}
.check{color:#57606a;font-size:12px}.where{font-weight:600}
.hint{color:#57606a;font-size:13px}.hint:before{content:"→ "}
.reason{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px;background:#f6f8fa;padding:1px 4px}
ul.where{margin:2px 0 2px 18px;padding:0;font-size:13px}
details>summary{cursor:pointer;color:#57606a;margin:6px 0}
div.fabric{max-width:100%;overflow:hidden}
"""


_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f]")
_RANK = {"error": 0, "notrun": 1, "warning": 2, "skipped": 3, "info": 4}


def _e(value: object) -> str:
    """Escape any value for element text and quoted attributes; None shows as an empty cell.

    Control characters (terminal colour codes in captured tool output) are dropped: they render as boxes.
    """
    return "" if value is None else html.escape(_CONTROL.sub("", str(value)), quote=True)


def _natural(name: str) -> tuple[object, ...]:
    """gpu2 before gpu10: digit runs compare as numbers."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def _folded(names: Iterable[str]) -> str:
    """Node names as one hostlist (``gpu[01-16]``); ``None`` (a cluster-wide result) shows as "cluster"."""
    return hostlist.compress(sorted(set(names), key=_natural))


class _Reasons:
    """Long texts that occur more than once on the page: the first mention is printed, later ones link to it."""

    def __init__(self, texts: Iterable[str]) -> None:
        counts = Counter(t for t in texts if len(t) >= LONG_REASON)
        self._ids = {t: f"reason-{i}" for i, t in enumerate(sorted(t for t, n in counts.items() if n > 1), 1)}
        self._shown: set[str] = set()

    def show(self, text: str) -> str:
        anchor = self._ids.get(text)
        if anchor is None:
            return f'<span class="reason">{_e(text)}</span>'
        if text in self._shown:
            return f'<a class="reason-ref" href="#{anchor}">same reason as above ({anchor})</a>'
        self._shown.add(text)
        return f'<span class="reason" id="{anchor}">{_e(text)}</span>'


# ---------------------------------------------------------------- bandwidth heatmaps


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
        f'<div class="scroll"><table class="heat" id="heat-rail-{rail}"><thead><tr><th>server \\ client</th>{head}'
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
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
        nodes = sorted(report.rail_nodes(rail), key=_natural)
        title = f"Rail {rail}" + (f" (line rate {rate:g} Gb/s)" if rate else " (line rate unknown)")
        body = _matrix(rail, cells, nodes, rate) if len(nodes) <= MAX_MATRIX_NODES else _worst(rail, cells, rate)
        parts.append(f"<h3>{_e(title)}</h3>{body}")
    return "".join(parts)


def _nccl_row(r: Mapping[str, float | str | None], label: str, css: str) -> str:
    """One all-reduce run as a table row, its efficiency coloured as the heatmaps."""
    def num(value: object, fmt: str) -> str:
        return format(value, fmt) if isinstance(value, float) else "–"

    eff = r.get("efficiency")
    colour = f' style="background:{_colour(eff)}"' if isinstance(eff, float) else ""
    cells = [f'<th scope="row">{_e(label)}</th>',
             f'<td>{num(r.get("busbw_gbps"), ".1f")}</td>',
             f'<td>{num(r.get("expected_busbw_gbps"), "g")} <span class="meta">{_e(r.get("expected_from") or "")}'
             "</span></td>",
             f'<td class="efficiency"{colour}>{num(eff, ".0%")}</td>',
             f'<td>{num(r.get("floor_gbps"), "g")} <span class="meta">{_e(r.get("floor_from") or "")}</span></td>']
    return f'<tr class="{css}">{"".join(cells)}</tr>'


def _nccl(report: VerifyReport) -> str:
    """The all-reduce figures: across the nodes, then each node's GPUs alone (network disabled): measured, expected
    from the spec's links, efficiency (coloured as the heatmaps)."""
    runs, nodes = report.nccl_runs(), report.nccl_node_runs()
    if not runs and not nodes:
        return "<p>No NCCL all-reduce figure in this run.</p>"
    rows = [_nccl_row(r, str(r.get("group") or "all GPU nodes"), "nccl-run") for r in runs]
    rows += [_nccl_row(r, f"{r.get('node')} alone (network disabled)", "nccl-node") for r in nodes]
    return ('<table class="nccl"><tr><th>run</th><th>bus bandwidth (GB/s)</th><th>expected (GB/s)</th>'
            "<th>efficiency</th><th>floor (GB/s)</th></tr>" + "".join(rows) + "</table>"
            '<p class="meta">Bus bandwidth at the largest size; expected = what the rails and the GPU links allow '
            "across nodes, the NVLink (or PCIe) figure of the GPU model inside one node (docs/verification.md).</p>")


# ---------------------------------------------------------------- findings by node


def _where(f: Finding) -> str:
    """Where on its node a finding is (the node is the section's title): ``mlx5_1/1 rail 1 ↔ gpu04``."""
    parts = []
    if f.device:
        parts.append(f.device if f.port is None else f"{f.device}/{f.port}")
    elif f.port is not None:
        parts.append(f"port {f.port}")
    if f.rail is not None:
        parts.append(f"rail {f.rail}")
    if f.peer:
        parts.append(f"↔ {f.peer}")
    return " ".join(parts)


def _head(kind: str, check: str, where: str = "") -> str:
    label = {"notrun": "could not run", "skipped": "skipped"}.get(kind, kind)
    return (f'<span class="sev-{kind}">{_e(label)}</span> <span class="check">{_e(check)}</span>'
            + (f' <span class="where">{_e(where)}</span>' if where else ""))


def _finding_item(f: Finding, reasons: _Reasons) -> str:
    observed = f.observed if isinstance(f.observed, str) and len(f.observed) >= LONG_REASON else None
    if observed is not None and observed in f.message:
        before, _, after = f.message.partition(observed)
        msg = f"{_e(before)}{reasons.show(observed)}{_e(after)}"
        seen = ""
    else:
        msg = _e(f.message)
        seen = f'<div class="meta">expected {_e(f.expected)} · observed {_e(f.observed)}</div>'
    hint = f'<div class="hint">{_e(f.hint)}</div>' if f.hint else ""
    return (f'<li class="finding" data-severity="{_e(f.severity)}">{_head(f.severity, f.check, _where(f))}'
            f'<div class="msg">{msg}</div>{seen}{hint}</li>')


def _shared_reason_item(group: Sequence[Finding], reason: str, reasons: _Reasons) -> str:
    """Findings of one node that share one long reason: the reason once, then each finding without it."""
    f = group[0]
    lines = "".join(f"<li>{_e(g.message.replace(reason, '…'))}</li>" for g in group)
    hint = f'<div class="hint">{_e(f.hint)}</div>' if f.hint else ""
    return (f'<li class="finding grouped" data-severity="{_e(f.severity)}" data-count="{len(group)}">'
            f'{_head(f.severity, f.check)} <span class="meta">{len(group)} ×</span>'
            f'<div class="msg">{reasons.show(reason)}</div><ul class="where">{lines}</ul>{hint}</li>')


def _finding_items(findings: Sequence[Finding], reasons: _Reasons) -> list[str]:
    """One entry per finding, except that findings sharing a long reason (check, observed, hint) are one."""
    groups: dict[tuple[str, str, str], list[Finding]] = defaultdict(list)
    for f in findings:
        if isinstance(f.observed, str) and len(f.observed) >= LONG_REASON and f.observed in f.message:
            groups[(f.check, f.observed, f.hint)].append(f)
    items: list[str] = []
    done: set[tuple[str, str, str]] = set()
    for f in findings:
        key = (f.check, str(f.observed), f.hint)
        if key in groups and len(groups[key]) > 1:
            if key not in done:
                done.add(key)
                items.append(_shared_reason_item(groups[key], str(f.observed), reasons))
            continue
        items.append(_finding_item(f, reasons))
    return items


def _result_items(kind: str, results: Sequence[CheckResult], reasons: _Reasons) -> list[str]:
    """Could-not-run or skipped results of one node, one entry per reason (the checks it applies to listed)."""
    by_reason: dict[str, list[str]] = defaultdict(list)
    for r in results:
        by_reason[(r.error if kind == "notrun" else r.skipped) or ""].append(r.name)
    return [f'<li class="result" data-severity="{kind}">{_head(kind, ", ".join(sorted(set(names))))}'
            f'<div class="msg">{reasons.show(why)}</div></li>' for why, names in by_reason.items()]


def _node_section(node: str | None, findings: Sequence[Finding], results: Sequence[CheckResult],
                  reasons: _Reasons) -> str:
    by = {s: [f for f in findings if f.severity == s] for s in ("error", "warning", "info")}
    notrun = [r for r in results if not r.ran]
    skipped = [r for r in results if r.ran and r.skipped is not None]
    counts = [f"{len(by['error'])} error(s)" if by["error"] else "",
              f"{len(notrun)} could not run" if notrun else "",
              f"{len(by['warning'])} warning(s)" if by["warning"] else "",
              f"{len(skipped)} skipped" if skipped else "",
              f"{len(by['info'])} info" if by["info"] else ""]
    items = (_finding_items(by["error"], reasons) + _result_items("notrun", notrun, reasons)
             + _finding_items(by["warning"], reasons) + _result_items("skipped", skipped, reasons))
    infos = ""
    if by["info"]:
        infos = (f'<details class="infos"><summary>{len(by["info"])} info line(s)</summary>'
                 f'<ul class="items">{"".join(_finding_items(by["info"], reasons))}</ul></details>')
    title = "cluster-wide" if node is None else node
    anchor = "cluster" if node is None else f"node-{node}"
    return (f'<section class="node" id="{_e(anchor)}" data-node="{_e(node or "")}">'
            f'<h3>{_e(title)} <span class="meta">{_e(" · ".join(c for c in counts if c))}</span></h3>'
            f'<ul class="items">{"".join(items)}</ul>{infos}</section>')


def _findings_by_node(report: VerifyReport, reasons: _Reasons) -> str:
    findings: dict[str | None, list[Finding]] = defaultdict(list)
    for f in report.findings():
        findings[f.node].append(f)
    results: dict[str | None, list[CheckResult]] = defaultdict(list)
    for c in report.checks:
        if not c.ran or c.skipped is not None:
            results[c.node].append(c)
    nodes = set(findings) | set(results)
    if not nodes:
        return "<p>No findings.</p>"

    def rank(node: str | None) -> tuple[object, ...]:
        kinds = [f.severity for f in findings[node]] + ["notrun" if not r.ran else "skipped" for r in results[node]]
        return (min(_RANK[k] for k in kinds), node is not None, _natural(node or ""))

    return "".join(_node_section(n, findings[n], results[n], reasons) for n in sorted(nodes, key=rank))


# ---------------------------------------------------------------- checks, versions


def _checks_table(checks: Iterable[CheckResult]) -> str:
    """One row per check: which nodes passed, failed, could not run or were skipped (as folded hostlists)."""
    table: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for c in checks:
        status = "notrun" if not c.ran else ("skipped" if c.skipped is not None else "pass" if c.passed else "fail")
        table[c.name][status].append(c.node or "cluster")
    rows = []
    for name in sorted(table):
        cells = "".join(f'<td class="{s}">{_e(_folded(table[name][s]))}</td>'
                        for s in ("pass", "fail", "notrun", "skipped"))
        rows.append(f'<tr class="check"><th scope="row">{_e(name)}</th>{cells}</tr>')
    if not rows:
        return "<p>No checks ran.</p>"
    return ('<table id="checks"><thead><tr><th>Check</th><th>passed</th><th class="sev-error">failed</th>'
            '<th class="sev-notrun">could not run</th><th>skipped</th></tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>"
            '<p class="meta">Why a check failed, could not run or was skipped is under its node above.</p>')


def _versions(report: VerifyReport) -> str:
    """Per peer group (one profile, same roles): each component's most common version and who differs."""
    if not report.versions:
        return "<p>No versions were collected.</p>"
    parts = []
    for group, versions in peer_versions(report.versions, report.peers).items():
        expected = expected_versions(versions)
        rows = []
        for comp, want in expected.items():
            odd = []
            for node in sorted(versions, key=_natural):
                got = versions[node].get(comp)
                if got is None:
                    odd.append(f'<span class="missing">{_e(node)}: missing</span>')
                elif got != want:
                    odd.append(f'<span class="mismatch">{_e(node)}: {_e(got)}</span>')
            rows.append(f"<tr><th scope=\"row\">{_e(comp)}</th><td>{_e(want)}</td><td>{'; '.join(odd)}</td></tr>")
        parts.append(f'<h3>{_e(group)}: {_e(_folded(versions))}</h3><table class="versions"><thead><tr>'
                     f"<th>component</th><th>most nodes</th><th>differs on</th></tr></thead>"
                     f"<tbody>{''.join(rows)}</tbody></table>")
    return "".join(parts)


def _long_texts(report: VerifyReport) -> list[str]:
    """Every reason the page may print, once per place it would be printed (for :class:`_Reasons`)."""
    results = {(c.node, c.ran, (c.error if not c.ran else c.skipped) or "")
               for c in report.checks if not c.ran or c.skipped is not None}  # one entry per node and reason
    shared = {(f.node, f.severity, f.check, f.observed, f.hint)  # a node's findings sharing a reason: one entry
              for f in report.findings() if isinstance(f.observed, str) and f.observed in f.message}
    return [why for _, _, why in results] + [str(observed) for _, _, _, observed, _ in shared]


def to_html(report: VerifyReport) -> str:
    """The full page: summary, findings by node, per-rail heatmaps, versions, per-check results, notes."""
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
    reasons = _Reasons(_long_texts(report))
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        f"<title>{_e(f'Fabric verification: {report.cluster}')}</title><style>{_CSS}</style></head><body>"
        f"<h1>Fabric verification: {_e(report.cluster)}</h1>"
        f'<p class="meta">started {_e(report.started.isoformat())} · '
        f"finished {_e(report.finished.isoformat())} · {report.duration_s:.0f} s</p>{summary}"
        f'<h2>Findings by node</h2><div id="findings">{_findings_by_node(report, reasons)}</div>'
        f'<h2>Fabric</h2><section id="fabric">{fabric_picture.section(report.fabric)}</section>'
        f"<h2>Pairwise bandwidth (ib_write_bw)</h2>{_heatmaps(report)}"
        f'<h2>NCCL all-reduce</h2><section id="nccl">{_nccl(report)}</section>'
        f"<h2>Versions (compared between peers: one profile, the same roles)</h2>{_versions(report)}"
        f"<h2>Checks</h2>{_checks_table(report.checks)}"
        f"{notes}</body></html>\n"
    )
