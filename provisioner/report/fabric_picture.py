"""The fabric as a picture: switch tiers, the links between them and every node port, coloured by verdict.

:func:`build` turns the spec (what is planned), the inter-switch comparison and the run's findings into a
:class:`FabricPicture`; :func:`to_svg` draws it as inline SVG (no script, no external asset) that scales to the
width of the page. Above :data:`MAX_DRAWN_SWITCHES` switches a drawing stops being readable and
:func:`summary_html` gives a table per tier instead (what is planned, what is up, which switches have findings).

Colours: green ok, amber warning, red error, grey not run / unknown; a missing switch is drawn dashed. Every
shape carries a ``<title>`` (hover text) naming what it is and its state, and a ``data-status`` attribute, so
the picture does not depend on colour alone.
"""

from __future__ import annotations

import html
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from provisioner.fabric.findings import CheckResult, Finding
from provisioner.fabric.switchlinks import TIERS, Comparison, PlannedLink
from provisioner.spec.cluster import Cluster

MAX_DRAWN_SWITCHES = 200
"""Above this many switches the report shows a per-tier summary instead of a drawing."""
COLOURS = {"ok": "#2da44e", "warning": "#d4a72c", "error": "#cf222e", "down": "#cf222e", "notrun": "#8c959f",
           "unknown": "#8c959f"}
_RANK = {"ok": 0, "unknown": 1, "notrun": 2, "warning": 3, "error": 4, "down": 5}


@dataclass(frozen=True, slots=True)
class PicSwitch:
    name: str
    tier: str
    status: str
    why: str = ""


@dataclass(frozen=True, slots=True)
class PicLink:
    """All planned cables between two switches as one line: how many are planned, up and bad."""

    lower: str
    upper: str
    planned: int
    up: int
    bad: int
    status: str


@dataclass(frozen=True, slots=True)
class PicPort:
    node: str
    device: str
    switch: str
    switch_port: int
    status: str
    why: str = ""


@dataclass(frozen=True, slots=True)
class FabricPicture:
    switches: tuple[PicSwitch, ...]
    links: tuple[PicLink, ...]
    ports: tuple[PicPort, ...]


def _worst(statuses: Iterable[str]) -> str:
    return max(statuses, key=lambda s: _RANK[s], default="ok")


def build(cluster: Cluster, checks: Sequence[CheckResult], planned: Sequence[PlannedLink],
          comparison: Comparison | None, lost: Mapping[str, str]) -> FabricPicture | None:
    """The picture of one run; None when the spec has no switches to draw."""
    if not cluster.switches:
        return None
    findings = [f for c in checks for f in c.findings]
    by_switch: dict[str, list[Finding]] = defaultdict(list)
    for f in findings:
        if f.switch and f.severity in ("error", "warning"):
            by_switch[f.switch].append(f)
    switches = []
    for sw in cluster.switches:
        mine = by_switch.get(sw.name, [])
        dead = any("not in the fabric" in f.message for f in mine)
        status = "down" if dead else _worst(f.severity for f in mine)
        switches.append(PicSwitch(sw.name, sw.tier, status, "; ".join(f.message for f in mine[:3])))
    links = _links(planned, comparison)
    notrun = {c.node for c in checks if not c.ran and c.node} | set(lost)
    per_port: dict[tuple[str, str], list[Finding]] = defaultdict(list)
    for f in findings:
        if f.node and f.device and f.severity in ("error", "warning"):
            per_port[(f.node, f.device)].append(f)
    ports = []
    for cab in cluster.cables:
        mine = per_port.get((cab.node, cab.device), [])
        status = "notrun" if cab.node in notrun else _worst(f.severity for f in mine)
        why = ("not reached (see the node's ssh result)" if cab.node in lost
               else "; ".join(f"{f.check}: {f.message}" for f in mine[:2]))
        ports.append(PicPort(cab.node, cab.device, cab.switch, cab.switch_port, status, why))
    return FabricPicture(tuple(switches), tuple(links), tuple(ports))


def _links(planned: Sequence[PlannedLink], comparison: Comparison | None) -> list[PicLink]:
    groups: dict[tuple[str, str], list[PlannedLink]] = defaultdict(list)
    for p in planned:
        groups[(p.switch, p.peer)].append(p)
    healthy: set[PlannedLink] = set()
    if comparison is not None:
        bad_ports = {(f.switch, f.port) for f in comparison.findings if f.severity == "error" and f.switch}
        for p, lk in comparison.matched:
            if lk.up and (lk.rate_gbps is None or lk.rate_gbps >= p.rate_gbps - 0.01) \
                    and (p.switch, p.port) not in bad_ports:
                healthy.add(p)
    out = []
    for (lower, upper), group in sorted(groups.items()):
        up = sum(1 for p in group if p in healthy)
        status = "unknown" if comparison is None else "ok" if up == len(group) else "error"
        out.append(PicLink(lower, upper, len(group), up, len(group) - up, status))
    return out


# ---------------------------------------------------------------- drawing


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


WIDTH = 1200
ROW = 110
BOX_H = 24
PORT = 7


def to_svg(pic: FabricPicture) -> str:
    """An inline SVG of the picture (tiers top-down: core, spine, leaf; node ports under their leaf)."""
    tiers = [t for t in reversed(TIERS) if any(s.tier == t for s in pic.switches)]
    pos: dict[str, tuple[float, float, float]] = {}  # name -> (x, y, width)
    for row, tier in enumerate(tiers):
        members = [s for s in pic.switches if s.tier == tier]
        slot = WIDTH / max(1, len(members))
        width = max(8.0, min(130.0, slot - 6))
        for i, s in enumerate(members):
            pos[s.name] = (i * slot + (slot - width) / 2, 20 + row * ROW, width)
    ports_by_switch: dict[str, list[PicPort]] = defaultdict(list)
    for p in pic.ports:
        ports_by_switch[p.switch].append(p)
    port_rows = 0
    for name, ports in ports_by_switch.items():
        if name in pos:
            per_row = max(1, int(pos[name][2] // (PORT + 2)))
            port_rows = max(port_rows, -(-len(ports) // per_row))
    height = 20 + len(tiers) * ROW + port_rows * (PORT + 2)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" id="fabric-svg" viewBox="0 0 {WIDTH} {height:.0f}" '
             f'width="100%" role="img" aria-label="fabric: switch tiers, links between them and node ports" '
             f'style="max-width:{WIDTH}px;height:auto;display:block">']
    for lk in pic.links:
        if lk.lower not in pos or lk.upper not in pos:
            continue
        lx, ly, lw = pos[lk.lower]
        ux, uy, uw = pos[lk.upper]
        colour = COLOURS[lk.status]
        tip = f"{lk.lower} ↔ {lk.upper}: {lk.up} of {lk.planned} planned links up" + (
            f", {lk.bad} missing or degraded" if lk.bad else "") if lk.status != "unknown" else (
            f"{lk.lower} ↔ {lk.upper}: {lk.planned} planned links, not checked")
        width = 1 + min(3, lk.planned // 4) if lk.status != "error" else 3
        parts.append(f'<line class="isl" data-status="{lk.status}" x1="{lx + lw / 2:.1f}" y1="{ly:.1f}" '
                     f'x2="{ux + uw / 2:.1f}" y2="{uy + BOX_H:.1f}" stroke="{colour}" stroke-width="{width}" '
                     f'stroke-opacity="0.7"><title>{_e(tip)}</title></line>')
    for s in pic.switches:
        x, y, w = pos[s.name]
        dash = ' stroke-dasharray="4 3"' if s.status == "down" else ""
        fill = "#fff" if s.status == "down" else COLOURS[s.status]
        tip = f"{s.name} ({s.tier}): {s.status}" + (f" — {s.why}" if s.why else "")
        label = (f'<text x="{x + w / 2:.1f}" y="{y + 16:.1f}" text-anchor="middle" font-size="11" '
                 f'fill="{"#cf222e" if s.status == "down" else "#fff"}">{_e(s.name[: int(w // 7)])}</text>'
                 if w >= 40 else "")
        parts.append(f'<g class="switch" data-switch="{_e(s.name)}" data-status="{s.status}"><title>{_e(tip)}</title>'
                     f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{BOX_H}" rx="3" fill="{fill}" '
                     f'stroke="{COLOURS[s.status]}"{dash}/>{label}</g>')
    for name, ports in ports_by_switch.items():
        if name not in pos:
            continue
        x, y, w = pos[name]
        per_row = max(1, int(w // (PORT + 2)))
        for i, p in enumerate(sorted(ports, key=lambda q: q.switch_port)):
            px = x + (i % per_row) * (PORT + 2)
            py = y + BOX_H + 6 + (i // per_row) * (PORT + 2)
            tip = f"{p.node} {p.device} → {p.switch} port {p.switch_port}: {p.status}" + (
                f" — {p.why}" if p.why else "")
            parts.append(f'<rect class="port" data-node="{_e(p.node)}" data-status="{p.status}" x="{px:.1f}" '
                         f'y="{py:.1f}" width="{PORT}" height="{PORT}" fill="{COLOURS[p.status]}">'
                         f"<title>{_e(tip)}</title></rect>")
    parts.append("</svg>")
    return "".join(parts)


def summary_html(pic: FabricPicture) -> str:
    """Per tier: switches by status, planned/up links, node ports by status; then the switches with findings."""
    rows = []
    for tier in (t for t in reversed(TIERS) if any(s.tier == t for s in pic.switches)):
        members = [s for s in pic.switches if s.tier == tier]
        counts = {k: sum(1 for s in members if s.status == k) for k in ("ok", "warning", "error", "down")}
        links = [lk for lk in pic.links if any(s.name == lk.lower for s in members)]
        ports = [p for p in pic.ports if any(s.name == p.switch for s in members)]
        pcount = {k: sum(1 for p in ports if p.status == k) for k in ("ok", "warning", "error", "notrun")}
        rows.append(
            f"<tr><th scope=\"row\">{_e(tier)}</th><td>{len(members)}: {counts['ok']} ok, {counts['warning']} "
            f"warning, {counts['error']} error, {counts['down']} not in the fabric</td>"
            f"<td>{sum(lk.up for lk in links)} of {sum(lk.planned for lk in links)} up</td>"
            f"<td>{len(ports)}: {pcount['ok']} ok, {pcount['warning']} warning, {pcount['error']} error, "
            f"{pcount['notrun']} not run</td></tr>")
    bad = [s for s in pic.switches if s.status != "ok"]
    listed = "".join(f'<li data-status="{s.status}"><b>{_e(s.name)}</b> ({_e(s.status)}): {_e(s.why)}</li>'
                     for s in bad[:50])
    more = f"<li>… and {len(bad) - 50} more (all in the findings above)</li>" if len(bad) > 50 else ""
    return (f'<p class="meta">{len(pic.switches)} switches: more than {MAX_DRAWN_SWITCHES}, so a summary per tier '
            "instead of a drawing.</p>"
            '<table id="fabric-summary"><thead><tr><th>tier</th><th>switches</th><th>links up (to the tier above)'
            f"</th><th>node ports</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
            + (f'<ul class="notes">{listed}{more}</ul>' if bad else ""))


def section(pic: FabricPicture | None) -> str:
    """The report's fabric section body."""
    if pic is None:
        return "<p>The spec lists no switches: there is no fabric to draw.</p>"
    if len(pic.switches) > MAX_DRAWN_SWITCHES:
        return summary_html(pic)
    legend = ('<p class="legend">' + "".join(
        f'<span style="background:{COLOURS[k]};color:#fff">{label}</span>'
        for k, label in (("ok", "ok"), ("warning", "warning"), ("error", "error / missing"), ("notrun", "not run")))
        + " · boxes: switches by tier · lines: planned links between two switches (thicker = more cables) · "
          "squares under a leaf: the node ports cabled to it · hover anything for details</p>")
    return legend + f'<div class="fabric">{to_svg(pic)}</div>'
