"""The HTML report, opened in headless Chromium, renders every section and every plot
without console errors. The screenshot is kept as a test artefact
($TEST_ARTIFACTS_DIR, default build/test-artifacts/report.png).

Chromium comes from scripts/install-test-browser (apt-get, root); where it cannot be had
the test is skipped with the reason, except under CI=true, where it fails."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from toolkit.config.telemetry import ReportConfig
from toolkit.telemetry.report.build import build_report
from toolkit.telemetry.report.html import PLOTS
from toolkit.telemetry.synthetic import Plan, generate

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)

REPO = Path(__file__).resolve().parents[2]
SECTIONS = ("Diagnosis", "Nodes", "Stragglers", "Idle gaps", "Where the time went", "Ranks")
# Appended to a copy of the page: collects errors and what rendered into <pre id=probe>,
# which --dump-dom prints once the page has loaded.
PROBE = """<script>
const errors = [];
window.addEventListener("error", e => errors.push(String(e.message || e.target.src || e)), true);
const consoleError = console.error;
console.error = (...a) => { errors.push(a.join(" ")); consoleError(...a); };
window.addEventListener("load", () => {
  const images = [...document.images].map(i => ({alt: i.alt, ok: i.complete && i.naturalWidth > 0}));
  const sections = [...document.querySelectorAll("h2")].map(h => h.textContent);
  const pre = document.createElement("pre");
  pre.id = "probe";
  pre.textContent = JSON.stringify({errors, images, sections});
  document.body.appendChild(pre);
});
</script>"""


@pytest.fixture(scope="session")
def chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        done = subprocess.run(
            [str(REPO / "scripts" / "install-test-browser")], capture_output=True, text=True
        )
        found = shutil.which("chromium")
        if found is None:
            reason = (done.stderr.strip().splitlines() or ["chromium not found"])[-1]
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(f"headless Chromium unavailable under CI=true: {reason}", pytrace=False)
            pytest.skip(f"headless Chromium unavailable: {reason}")
    return found


def headless(browser: str, *args: str) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    return subprocess.run(
        [browser, *flags, "--virtual-time-budget=10000", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_html_report_renders_every_section_and_plot_without_errors(tmp_path, chromium):
    run_dir = tmp_path / "run"
    generate(run_dir, Plan(nodes=2, gpus_per_node=2, duration_s=1800, idle_gap_at_s=900.0))
    report = build_report(run_dir, None, ReportConfig(sacct=False))
    page = Path(report.outputs["html"])
    probed = page.with_name("probed.html")
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))

    dom = headless(chromium, "--dump-dom", probed.as_uri())
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom.stdout, re.S)
    assert found, dom.stderr[-2000:]
    result = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert result["errors"] == []
    titles = [title for _key, title in PLOTS]
    assert [i["alt"] for i in result["images"]] == [t for t in titles if t in result["sections"]]
    assert set(titles) <= set(result["sections"]), "a plot is missing"
    assert all(i["ok"] for i in result["images"]), result["images"]
    assert set(SECTIONS) <= set(result["sections"])

    artefacts = Path(os.environ.get("TEST_ARTIFACTS_DIR", REPO / "build" / "test-artifacts"))
    artefacts.mkdir(parents=True, exist_ok=True)
    shot = artefacts / "report.png"
    done = headless(chromium, f"--screenshot={shot}", "--window-size=1400,9000", page.as_uri())
    assert shot.is_file() and shot.stat().st_size > 10_000, done.stderr[-2000:]
