"""JSON, JUnit XML and HTML reports of a verification run (plus one render in a real headless browser)."""

from __future__ import annotations

import json
import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path

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
from provisioner.report import VerifyReport, html_report, to_html, to_json, to_junit, version_mismatches

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
    findings = [a for t, a in tags if t == "tr" and a.get("class") == "finding"]
    assert [a["data-severity"] for a in findings] == ["error", "warning"]
    assert sum(1 for t, a in tags if t == "td" and a.get("class") == "mismatch") == 2
    assert sum(1 for t, a in tags if t == "td" and a.get("class") == "missing") == 1
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
]


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_html_renders_in_headless_chromium(tmp_path: Path) -> None:
    report = build_report()
    page = tmp_path / "report.html"
    page.write_text(to_html(report), encoding="utf-8")
    base = [str(CHROMIUM), *CHROME_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(
        [*base, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    tags = parse(dom)
    measured = sum(len(m) for m in report.bandwidth.values())
    assert sum(1 for t, a in tags if t == "td" and a.get("class") == "bw") == 2 * measured
    assert sum(1 for t, a in tags if t == "tr" and a.get("class") == "finding") == 2
    assert "&lt;img" in dom and "<img" not in dom  # the hostile string stayed text in the live DOM
    shot = tmp_path / "report.png"
    subprocess.run(
        [*base, f"--screenshot={shot}", "--window-size=1400,1800", page.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
