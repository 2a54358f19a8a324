"""JSON, JUnit XML and HTML reports of a verification run (plus one render in a real headless browser)."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from provisioner.fabric.findings import CheckResult, Finding
from provisioner.fabric.schedule import (
    CHECK_NAME,
    PairResult,
    Round,
    judge,
    run_quick,
    verdict_findings,
)
from provisioner.report import VerifyReport, fabric_picture, html_report, to_html, to_json, to_junit, version_mismatches

NODES = [f"gpu{i:02d}" for i in range(6)]
RAILS = (0, 1)
LINE_RATE = 400.0
HOSTILE = '<img src=x onerror="alert(1)">&'


def build_report(nodes: Sequence[str] = NODES) -> VerifyReport:
    """A quick-mode run over the scheduler with one slow port (gpu03 rail 1) and one hostile string."""
    bandwidth: dict[int, dict[tuple[str, str], float]] = {r: {} for r in RAILS}

    def measure(rnd: Round, rails: Sequence[int]) -> list[PairResult]:
        out = []
        for rail in rails:
            for p in rnd.pairs:
                slow = rail == 1 and "gpu03" in p.nodes
                gbps = 212.4 if slow else 391.7
                bandwidth[rail][(p.server, p.client)] = gbps
                out.append(judge(p, rail, gbps, LINE_RATE))
        return out

    _, loc = run_quick(nodes, RAILS, measure)
    bw_check = CheckResult.from_findings(
        CHECK_NAME, None, verdict_findings(loc, device_by_rail={0: "mlx5_0", 1: "mlx5_1"})
    )
    port_warn = Finding(
        check="port_state",
        severity="warning",
        node="gpu01",
        device="mlx5_0",
        port=1,
        expected="0 symbol errors",
        observed=17,
        message=f"symbol errors rising {HOSTILE}",
        hint="watch perfquery",
    )
    checks = (
        bw_check,
        CheckResult.from_findings("port_state", "gpu01", [port_warn], {"rate_gbps": 400.0}),
        CheckResult.from_findings("port_state", "gpu00", [], {"rate_gbps": 400.0}),
        CheckResult.could_not_run("gdr_copy", "gpu05", "ssh: connection refused\x1b[0m"),
    )
    versions = {n: {"driver": "550.54.15", "nccl": "2.21.5", "ofed": "24.07"} for n in nodes}
    versions["gpu04"] = {"driver": "535.161.08", "nccl": "2.21.5"}  # drifted and missing OFED
    versions["gpu02"] = {"driver": "550.54.15", "nccl": HOSTILE, "ofed": "24.07"}
    return VerifyReport(
        cluster="lab-a",
        started=datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC),
        finished=datetime(2025, 3, 1, 12, 4, 30, tzinfo=UTC),
        checks=checks,
        bandwidth=bandwidth,
        line_rate={0: LINE_RATE, 1: LINE_RATE},
        versions=versions,
        notes=(*loc.notes, "quick mode: 3 of 15 pairs per rail measured"),
    )


# --- JSON ------------------------------------------------------------------------------------------------


def test_json_is_stable_and_complete() -> None:
    report = build_report()
    text = to_json(report)
    assert text == to_json(report)  # deterministic
    data = json.loads(text)
    assert list(data) == sorted(data)
    assert data["verdict"]["exit_code"] == 1 and data["verdict"]["label"] == "FAIL"
    assert data["duration_s"] == 270.0
    rail1 = data["bandwidth"]["1"]
    assert rail1["line_rate_gbps"] == LINE_RATE
    slow = [p for p in rail1["pairs"] if p["gbps"] == 212.4]
    assert slow and all(abs(p["fraction_of_line_rate"] - 212.4 / 400) < 1e-9 for p in slow)
    bad = [f for f in data["findings"] if f["severity"] == "error"]
    assert [(f["node"], f["rail"]) for f in bad] == [("gpu03", 1)]
    assert {"node": "gpu04", "component": "ofed", "observed": None, "expected": "24.07"} in data["version_mismatches"]


def test_version_mismatches_use_the_majority() -> None:
    report = build_report()
    got = {(n, c) for n, c, _, _ in version_mismatches(report.versions)}
    assert got == {("gpu04", "driver"), ("gpu04", "ofed"), ("gpu02", "nccl")}


# --- JUnit -----------------------------------------------------------------------------------------------


def test_junit_parses_and_carries_findings() -> None:
    xml_text = to_junit(build_report())
    root = ET.fromstring(xml_text.split("?>", 1)[1])
    assert root.tag == "testsuites"
    assert root.attrib["tests"] == "4" and root.attrib["failures"] == "1" and root.attrib["errors"] == "1"
    cases = {c.attrib["name"]: c for c in root.iter("testcase")}
    assert set(cases) == {CHECK_NAME, "port_state on gpu00", "port_state on gpu01", "gdr_copy on gpu05"}
    failure = cases[CHECK_NAME].find("failure")
    assert failure is not None and "gpu03" in (failure.text or "") and "rail 1" in (failure.text or "")
    error = cases["gdr_copy on gpu05"].find("error")
    assert error is not None and "\x1b" not in error.attrib["message"]  # control char replaced, XML valid
    out = cases["port_state on gpu01"].find("system-out")
    assert out is not None and HOSTILE in (out.text or "")  # escaped by the writer, restored by the parser
    assert cases["port_state on gpu00"].find("failure") is None


# --- HTML ------------------------------------------------------------------------------------------------


class _Collector(HTMLParser):
    """Collects the tags and attributes of the page, to check structure without a browser."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def parse(page: str) -> list[tuple[str, dict[str, str | None]]]:
    collector = _Collector()
    collector.feed(page)
    return collector.tags


def test_html_heatmap_findings_and_versions() -> None:
    report = build_report()
    page = to_html(report)
    tags = parse(page)
    cells = [a for t, a in tags if t == "td" and a.get("class") == "bw"]
    measured = sum(len(m) for m in report.bandwidth.values())
    assert len(cells) == 2 * measured  # each measured pair fills its cell and the mirrored one
    slow = [a for a in cells if a.get("data-rail") == "1" and "gpu03" in (a.get("data-a"), a.get("data-b"))]
    assert slow and all("53% of 400 Gb/s" in (a.get("title") or "") for a in slow)
    assert {a.get("data-low") for a in slow} == {"1"}
    assert sum(1 for a in cells if a.get("data-low")) == len(slow)
    assert all("hsl(" in (a.get("style") or "") for a in cells)
    findings = [a for t, a in tags if t == "li" and a.get("class") == "finding"]
    assert [a["data-severity"] for a in findings] == ["error", "warning"]
    sections = [a["data-node"] for t, a in tags if t == "section" and a.get("class") == "node"]
    assert sections == ["gpu03", "gpu05", "gpu01"]  # errors first, then could not run, then warnings
    assert sum(1 for t, a in tags if t == "span" and a.get("class") == "mismatch") == 2
    assert sum(1 for t, a in tags if t == "span" and a.get("class") == "missing") == 1
    assert 'id="heat-rail-0"' in page and 'id="heat-rail-1"' in page


def test_html_escapes_everything_and_fetches_nothing() -> None:
    page = to_html(build_report())
    assert "<img" not in page
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;&amp;" in page
    assert not any(t in {"script", "link", "img", "iframe"} for t, _ in parse(page))
    assert "\x1b" not in page
    assert "http://" not in page and "https://" not in page
    assert "default-src 'none'" in page


def test_html_large_rail_lists_worst_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(html_report, "MAX_MATRIX_NODES", 4)
    page = to_html(build_report())
    tags = parse(page)
    assert "slowest are listed instead" in page
    assert not any(t == "td" and a.get("class") == "diag" for t, a in tags)


def test_html_without_measurements() -> None:
    report = VerifyReport(
        cluster="empty",
        started=datetime(2025, 1, 1, tzinfo=UTC),
        finished=datetime(2025, 1, 1, tzinfo=UTC),
        checks=(),
    )
    page = to_html(report)
    assert "No pairwise bandwidth was measured." in page and "No findings." in page
    assert 'class="verdict v-PASS"' in page


# --- a real browser --------------------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROME_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
]
LAPTOP = "--window-size=1280,900"

BIG_SPEC = """
cluster: {name: h100-16, os: ubuntu-22.04}
software: {driver: {version: "550.90.07"}, cuda: "12.4.1", nccl: "2.21.5", ofed: {flavor: doca, version: "2.9.1"}}
repositories:
  cuda: {url: "http://m/cuda", key: k.gpg}
  doca: {url: "http://m/doca", key: k.gpg}
profiles:
  hgx: {gpu: {model: H100-SXM5-80GB, count: 8, nvswitch: true}, hcas: [{device: "mlx5_[0-7]", rate: NDR}]}
  svc: {hcas: [{device: mlx5_0, rate: NDR}]}
nodes:
  - {name: "hgx-r07-[01-16]", address: "10.10.0.[11-26]", profile: hgx}
  - {name: "sm[1-2]", address: "10.10.0.[2-3]", profile: svc, roles: [subnet_manager]}
switches:
  - {name: "rail[0-7]", tier: leaf, ports: 64, uplinks: 0}
fabric:
  rate: NDR
  topology: {kind: rail_optimized}
  subnet_manager: {nodes: [{node: sm1, priority: 15}, {node: sm2, priority: 14}]}
verify: {tests: [links, bandwidth, nccl]}
"""


def node(i: int) -> str:
    """The big report's node names: what a site names by rack and slot (wider than gpu05 in a table)."""
    return f"hgx-r07-{i:02d}"


#: What ib_write_bw prints when its out-of-band exchange fails (perftest's perftest_communication.c messages).
PERFTEST_FAILS = ("exit 1: Unable to init the socket connection | Failed to exchange data between server and "
                  "clients | Couldn't connect to the remote side")
#: SshRemote's message for a changed host key (provisioner/remote.py), with its hint.
HOST_KEY = (f"{node(16)} (10.10.0.26): host key CHANGED: offered ssh-ed25519 SHA256:JMCyKCDRbdeoLjRXNGKRyQGxJl/f0XU2"
            "Ab3obkXXjaM, /home/ops/clusters/h100-16/known_hosts has "
            "SHA256:3oNn0v0gk3p6GmZ5vY2kqkQ0bY5lq7Zl1wq3tqkq9aA; refusing to connect (if the node was reinstalled or "
            "swapped, confirm the new fingerprint on its console, "
            f"then bring it back: provision replace-node <cluster.yaml> {node(16)} --host-key-fingerprint "
            "SHA256:JMCyKCDRbdeoLjRXNGKRyQGxJl/f0XU2Ab3obkXXjaM)")


def build_big_report() -> VerifyReport:
    """16 nodes x 8 rails through the real bandwidth check: node 9's perftest fails on every rail with one long
    reason, node 5 rail 3 is slow, node 12 has a 2X link, node 3's counters warn, node 16 refused us (host key)."""
    from provisioner.drift import peer_groups
    from provisioner.fabric import bandwidth, reach
    from provisioner.fabric.perftest import PairRun
    from provisioner.spec import load_text

    loaded = load_text(BIG_SPEC, "cluster.yaml")
    assert loaded.cluster is not None, [d.format() for d in loaded.diagnostics]
    cluster = loaded.cluster
    lost = {node(16): HOST_KEY}

    def runner(server: str, client: str, rail: int) -> PairRun:
        if node(9) in (server, client):
            return PairRun(None, PERFTEST_FAILS)
        if rail == 3 and node(5) in (server, client):
            return PairRun(212.4, "")
        return PairRun(391.7 - rail * 0.3, "")

    out = bandwidth.check_bandwidth(reach.reachable(cluster, lost), runner)
    gpus = [n.name for n in cluster.nodes if n.gpu_count and n.name not in lost]
    links = [CheckResult.from_findings("links", n, []) for n in gpus if n not in (node(3), node(12))]
    links.append(CheckResult.from_findings("links", node(3), [Finding(
        "links", "warning", node(3), "mlx5_2", 1, "0 symbol errors", 17,
        "mlx5_2/1 error counters above threshold: symbol_error 17 (> 10)",
        "reseat the cable; perfquery -x shows the counters")]))
    links.append(CheckResult.from_findings("links", node(12), [Finding(
        "links", "error", node(12), "mlx5_6", 1, "4X", "2X", "mlx5_6/1: width 2X, expected 4X (rate 200 of 400 Gb/s)",
        "a lane is down: reseat or replace the cable or transceiver")]))
    nccl = CheckResult.from_findings("nccl", None, [Finding(
        "nccl", "error", None, None, None, 350, 41.2, "all-reduce bus bandwidth 41.2 GB/s at 8589934592 is below "
        "350 GB/s over 15 nodes", "check GPUDirect (nvidia_peermem), NCCL_IB_HCA and the rails")])
    fw = {f"firmware mlx5_{i}": "28.39.1002" for i in range(8)}
    sw = {"ofed": "24.10-1.1.4.0", "doca": "2.9.1-1", "driver": "550.90.07", "cuda": "12.4.1", "nccl": "2.21.5"}
    versions = {n: {**sw, **fw} for n in gpus}
    versions[node(7)] = {**versions[node(7)], "driver": "550.127.05", "firmware mlx5_4": "28.40.1000"}
    versions.update({s: {"ofed": sw["ofed"], "doca": sw["doca"], "firmware mlx5_0": "28.39.1002"}
                     for s in ("sm1", "sm2")})
    every = [n.name for n in cluster.nodes if n.gpu_count]
    checks = reach.settle([*links, out.result, nccl, *reach.skipped("bandwidth", every, lost),
                           *reach.skipped("nccl", every, lost)], lost)
    return VerifyReport(
        cluster="h100-16", started=datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC),
        finished=datetime(2025, 3, 1, 12, 9, 30, tzinfo=UTC), checks=tuple(checks), bandwidth=out.matrix,
        line_rate=out.line_rate, versions=versions, notes=tuple(out.notes),
        peers={n: g for g, ns in peer_groups(cluster).items() for n in ns}, fabric=big_fabric_picture())


def big_fabric_picture() -> fabric_picture.FabricPicture:
    """examples/h100-ndr-64node-3tier.yaml (41 switches, 514 node ports) with spine07 dead, two of leaf03's
    uplinks missing, one bad node port and one node that could not be reached."""
    from provisioner.fabric import switchlinks
    from provisioner.spec import load_text

    text = (Path(__file__).resolve().parents[2] / "examples" / "h100-ndr-64node-3tier.yaml").read_text()
    loaded = load_text(text, "cluster.yaml")
    assert loaded.cluster is not None
    c = loaded.cluster
    planned = switchlinks.plan(c)
    live = [switchlinks.LiveLink(p.switch, p.port, p.peer, p.peer_port, "active", "linkup", "4X", p.rate_gbps)
            for p in planned if "spine07" not in (p.switch, p.peer) and not (p.switch == "leaf03" and p.port > 62)]
    view = switchlinks.LiveView(links=live, seen={s.name for s in c.switches} - {"spine07"})
    comparison = switchlinks.compare(c, planned, view)
    checks = [CheckResult.from_findings("switch_links", None, comparison.findings),
              CheckResult.from_findings("links", "gpu005", [Finding(
                  "links", "error", "gpu005", "mlx5_3", 1, "Active/LinkUp", "down/polling",
                  "mlx5_3/1 is down/polling", "check the cable")])]
    pic = fabric_picture.build(c, checks, planned, comparison, {"gpu064": HOST_KEY})
    assert pic is not None
    return pic


#: Appended to a copy of the page (whose CSP forbids scripts): writes what the browser laid out into the DOM.
MEASURE = """<script>
const s = document.scrollingElement;
const sections = [...document.querySelectorAll("section.node")].map(e => ({
  node: e.dataset.node,
  items: [...e.querySelectorAll(":scope > ul.items > li")].map(li => li.dataset.severity)}));
const infos = [...document.querySelectorAll("li[data-severity=info]")];
const svg = document.querySelector("#fabric-svg");
const out = {scrollWidth: s.scrollWidth, clientWidth: s.clientWidth, sections: sections,
  fabricWidth: svg ? svg.getBoundingClientRect().right : null,
  infos: infos.length, infosOutsideDetails: infos.filter(li => !li.closest("details")).length,
  openDetails: document.querySelectorAll("details[open]").length, text: document.body.textContent};
const pre = document.createElement("pre"); pre.id = "measure"; pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script>"""


def _chromium() -> str:
    """The browser, or a skip where it is missing; in CI a missing browser fails (the bootstrap installs it)."""
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing in CI: scripts/test bootstraps it (PROVISIONER_WITH_CHROMIUM=1)")
        pytest.skip("chromium is not installed (apt-get install -y chromium, or PROVISIONER_WITH_CHROMIUM=1 "
                    "bash scripts/bootstrap.sh)")
    return CHROMIUM


def _laid_out(tmp_path: Path, page: str) -> dict[str, Any]:
    """What headless chromium at laptop width (1280 px) laid out for ``page``."""
    probe = tmp_path / "measure.html"
    probe.write_text(re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page)
                     .replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    base = [_chromium(), *CHROME_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", LAPTOP]
    dom = subprocess.run([*base, "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    found = re.search(r'<pre id="measure">(.*?)</pre>', dom, re.S)
    assert found, dom[-2000:]
    data: dict[str, Any] = json.loads(html.unescape(found.group(1)))
    return data


@pytest.mark.slow
def test_big_report_reads_at_laptop_width_in_headless_chromium(tmp_path: Path) -> None:
    """16 nodes x 8 rails with failures, in a real browser at 1280 px: no horizontal scroll, findings grouped
    by node with the errors first, infos folded away, and each long reason printed once."""
    report = build_big_report()
    page = to_html(report)
    got = _laid_out(tmp_path, page)
    assert got["scrollWidth"] <= got["clientWidth"] == 1280, (got["scrollWidth"], got["clientWidth"])
    assert 0 < got["fabricWidth"] <= 1280, got["fabricWidth"]  # the fabric picture scales into the page
    sections = [(s["node"], s["items"]) for s in got["sections"]]
    nodes = [n for n, _ in sections]
    assert len(nodes) == len(set(nodes))  # one section per node
    order = ["error", "notrun", "warning", "skipped", "info"]
    ranks = [min(order.index(k) for k in [*items, "info"]) for _, items in sections]
    assert ranks == sorted(ranks), sections  # nodes with errors first
    assert nodes[:6] == ["", node(5), node(9), node(12), node(16), node(3)], nodes  # errors, not run, warnings
    assert all(items == sorted(items, key=order.index) for _, items in sections)
    assert dict(sections)[node(16)] == ["notrun", "skipped"]  # one could-not-run, its skipped pairs on one line
    assert got["infos"] > 0 and got["infosOutsideDetails"] == 0 and got["openDetails"] == 0
    assert got["text"].count(PERFTEST_FAILS) == 1, got["text"].count(PERFTEST_FAILS)
    assert got["text"].count(HOST_KEY) == 1
    assert "same reason as above" in got["text"]


@pytest.mark.slow
def test_html_renders_in_headless_chromium(tmp_path: Path) -> None:
    """The page as written (CSP on, no script) renders: every heatmap cell, the findings, the hostile string as
    text; and a screenshot at laptop width is a PNG."""
    report = build_report()
    page = tmp_path / "report.html"
    page.write_text(to_html(report), encoding="utf-8")
    base = [_chromium(), *CHROME_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(
        [*base, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    tags = parse(dom)
    measured = sum(len(m) for m in report.bandwidth.values())
    assert sum(1 for t, a in tags if t == "td" and a.get("class") == "bw") == 2 * measured
    assert sum(1 for t, a in tags if t == "li" and a.get("class") == "finding") == 2
    assert "&lt;img" in dom and "<img" not in dom  # the hostile string stayed text in the live DOM
    shot = tmp_path / "report.png"
    subprocess.run([*base, f"--screenshot={shot}", LAPTOP, page.as_uri()], capture_output=True, timeout=120,
                   check=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fabric_picture_colours_switches_links_and_ports() -> None:
    pic = big_fabric_picture()
    status = {s.name: s.status for s in pic.switches}
    assert status["spine07"] == "down" and status["leaf03"] in ("error", "warning")
    assert {s for s, v in status.items() if v == "ok"} == {s.name for s in pic.switches} - {
        "spine07", "leaf03", *{lk.lower for lk in pic.links if lk.upper == "spine07"}}
    bad_links = {(lk.lower, lk.upper) for lk in pic.links if lk.status == "error"}
    assert ("leaf03", "spine16") in bad_links and all("spine07" in (lo, u) or lo == "leaf03" for lo, u in bad_links)
    ports = {(p.node, p.device): p.status for p in pic.ports}
    assert len(ports) == 514 and ports[("gpu005", "mlx5_3")] == "error"
    assert {d for (n, d), v in ports.items() if n == "gpu064"} == {f"mlx5_{i}" for i in range(8)}
    assert all(v == "notrun" for (n, _), v in ports.items() if n == "gpu064")
    svg = fabric_picture.to_svg(pic)
    assert svg.count('class="switch"') == 41 and svg.count('class="port"') == 514
    assert svg.count('class="port" data-node="gpu005" data-status="error"') == 1
    assert "stroke-dasharray" in svg and "http" not in svg.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_fabric_picture_is_a_summary_above_a_few_hundred_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fabric_picture, "MAX_DRAWN_SWITCHES", 40)
    body = fabric_picture.section(big_fabric_picture())
    assert "<svg" not in body and 'id="fabric-summary"' in body
    assert "<td>16: 15 ok, 0 warning, 0 error, 1 not in the fabric</td><td>465 of 496 up</td>" in body  # spines
    assert "<td>17: 1 ok, 15 warning, 1 error, 0 not in the fabric</td><td>480 of 514 up</td>" in body  # leaves
    assert '<li data-status="down"><b>spine07</b>' in body
    assert fabric_picture.section(None).startswith("<p>The spec lists no switches")


def test_browser_tests_fail_rather_than_skip_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(f"{__name__}.CHROMIUM", None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="chromium is missing in CI"):
        _chromium()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="chromium is not installed"):
        _chromium()


# --- NCCL efficiency ------------------------------------------------------------------------------------------


def nccl_report() -> VerifyReport:
    """Two P_Key groups measured by the NCCL check: one healthy, one at 60 % of what its rails carry."""
    from provisioner.fabric.nccl import EFFICIENCY_KEYS

    def group(label: str, busbw: float, eff: float) -> dict[str, float | str | None]:
        figures = dict(zip(EFFICIENCY_KEYS, (100.0, "2 x 400 Gb/s rails per node", eff, 80.0,
                                             "80% of the expected 100 GB/s"), strict=True))
        return {f"busbw_gbps {label}": busbw, **{f"{k} {label}": v for k, v in figures.items()}}

    nccl = CheckResult.from_findings("nccl", None, [], {
        "nodes": 4, "groups": 2, **group("tenant_a (P_Key 0x8001)", 94.0, 0.94),
        **group("the default partition", 60.0, 0.6)})
    return VerifyReport(cluster="lab-n", started=datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC),
                        finished=datetime(2025, 3, 1, 12, 1, 0, tzinfo=UTC), checks=(nccl,))


def test_nccl_efficiency_reaches_json_html_and_the_terminal() -> None:
    from provisioner.report.model import nccl_line

    report = nccl_report()
    runs = json.loads(to_json(report))["nccl"]
    assert [(r["group"], r["busbw_gbps"], r["expected_busbw_gbps"], r["efficiency"]) for r in runs] == [
        ("tenant_a (P_Key 0x8001)", 94.0, 100.0, 0.94), ("the default partition", 60.0, 100.0, 0.6)]
    assert nccl_line(runs[1]) == ("NCCL all-reduce (the default partition): 60.0 GB/s, 60% of the expected 100 GB/s "
                                  "(2 x 400 Gb/s rails per node); floor 80 GB/s (80% of the expected 100 GB/s)")
    page = to_html(report)
    rows = re.findall(r'<tr class="nccl-run">(.*?)</tr>', page)
    assert len(rows) == 2 and "94%" in rows[0] and "60%" in rows[1] and "tenant_a (P_Key 0x8001)" in rows[0]
    assert 'id="nccl"' in page
    empty = VerifyReport(cluster="x", started=report.started, finished=report.finished, checks=())
    assert empty.nccl_runs() == [] and "No NCCL all-reduce figure" in to_html(empty)


def single_node_report(count: int = 2) -> VerifyReport:
    """The NCCL check's single-node runs next to the inter-node one: gpu01 healthy, gpu02 with an NVLink down."""
    from provisioner.fabric.nccl import EFFICIENCY_KEYS

    def node(name: str, busbw: float) -> CheckResult:
        figures = dict(zip(EFFICIENCY_KEYS, (450.0, "NVLink 450 GB/s per H100-SXM5-80GB", round(busbw / 450, 3),
                                             315.0, "70% of the expected 450 GB/s"), strict=True))
        return CheckResult.from_findings("nccl_node", name, [], {"gpus": 8, "busbw_gbps": busbw, **figures})

    nodes = [node(f"gpu{i:02d}", 96.3 if i == 2 else 370.1) for i in range(1, count + 1)]
    return replace(nccl_report(), checks=(*nccl_report().checks, *nodes))


def test_single_node_efficiency_reaches_json_html_and_the_terminal() -> None:
    from provisioner.report.model import nccl_lines

    report = single_node_report()
    doc = json.loads(to_json(report))
    assert [(r["node"], r["busbw_gbps"], r["expected_busbw_gbps"], r["efficiency"]) for r in doc["nccl_single_node"]] \
        == [("gpu01", 370.1, 450, 0.822), ("gpu02", 96.3, 450, 0.214)]
    assert len(doc["nccl"]) == 2  # the inter-node runs stay where they were
    lines = nccl_lines(report)
    assert lines[2:] == [
        "NCCL all-reduce in gpu01 alone (network disabled): 370.1 GB/s, 82% of the expected 450 GB/s (NVLink 450 GB/s"
        " per H100-SXM5-80GB); floor 315 GB/s (70% of the expected 450 GB/s)",
        "NCCL all-reduce in gpu02 alone (network disabled): 96.3 GB/s, 21% of the expected 450 GB/s (NVLink 450 GB/s"
        " per H100-SXM5-80GB); floor 315 GB/s (70% of the expected 450 GB/s)"]
    rows = re.findall(r'<tr class="nccl-node">(.*?)</tr>', to_html(report))
    assert len(rows) == 2 and "gpu02 alone (network disabled)" in rows[1] and "21%" in rows[1]


def test_many_single_node_runs_are_one_terminal_line_with_the_lowest_node() -> None:
    from provisioner.report.model import nccl_lines

    lines = nccl_lines(single_node_report(count=12))
    assert lines[2:] == ["NCCL all-reduce in each of 12 GPU nodes alone (network disabled): lowest gpu02 96.3 GB/s, "
                         "21% of the expected 450 GB/s (NVLink 450 GB/s per H100-SXM5-80GB); 1 below its floor; "
                         "every node in the reports"]
