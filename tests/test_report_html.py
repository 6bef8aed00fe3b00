"""The HTML report as a reader sees it: Markdown rendered (no raw `**` or backticks), headings with
anchors and a table of contents, the summary first and the runs last, and, in headless Chromium
at 1280 px, a page that fits the window's width (a screenshot is taken and checked)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kbench.report import write_report

from test_report import standard_run

# what works on a closed network as root (see scripts/setup-debian.sh, which installs chromium)
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]
WIDTH = 1280


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("html")
    runs = tmp / "runs"
    standard_run(runs, "GPU Alpha", 1.0)
    standard_run(runs, "GPU Beta with a rather long device name (LLVM 15.0.6, 256 bits)", 2.0, softmax_status="fail")
    standard_run(runs, "GPU Alpha", 3.0, backend="torch-cuda")
    write_report([runs], tmp / "report")
    return tmp / "report"


def test_html_is_rendered_markdown_with_anchors_and_contents(report_dir):
    page = (report_dir / "report.html").read_text()
    body = re.sub(r"<style>.*?</style>", "", page, flags=re.S)
    assert "**" not in body and "`" not in body, "raw Markdown emphasis or code marks left in the HTML"
    assert "<strong>Correctness</strong>" in body and "<code>" in body
    ids = re.findall(r'<h2 id="([^"]+)"', body)
    assert ids[0] == "summary" and ids[-1] == "runs-and-provenance", f"sections in order {ids}"
    links = set(re.findall(r'href="#([^"]+)"', body))
    assert set(ids) <= links, f"the contents should link every section: missing {set(ids) - links}"
    assert 'class="st-fail"' in body, "a failed cell should be coloured"
    for src in re.findall(r'<img[^>]+src="([^"]+)"', body):
        assert (report_dir / src).is_file(), f"report.html shows a missing image {src}"


def test_index_md_opens_on_the_summary_with_a_winner(report_dir):
    text = (report_dir / "index.md").read_text()
    sections = re.findall(r"^## (.+)$", text, flags=re.M)
    assert sections[0] == "Summary" and sections[-1] == "Runs and provenance", sections
    summary = text.split("## Summary")[1].split("\n## ")[0]
    assert "winner" in summary and "GPU Alpha (torch-cuda)" in summary, summary


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed on CI: scripts/setup-debian.sh should install it")
        pytest.skip("chromium is not installed (apt-get install chromium, as scripts/setup-debian.sh does)")
    return exe


def _run_chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess:
    return subprocess.run([_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=120)


def test_report_fits_1280_px_in_headless_chromium(report_dir, tmp_path):
    # the page reports its own laid-out width: a copy with a script that writes it into the title
    probe = report_dir / "width-probe.html"
    probe.write_text((report_dir / "report.html").read_text().replace(
        "</body>", "<script>document.title = 'width=' + document.documentElement.scrollWidth;</script></body>"))
    dom = _run_chromium([f"--window-size={WIDTH},900", "--dump-dom", probe.as_uri()], tmp_path / "p1")
    found = re.search(r"<title>width=(\d+)</title>", dom.stdout)
    assert found, f"chromium printed no laid-out page: {dom.stderr[-2000:]}"
    assert int(found.group(1)) <= WIDTH, f"the report is {found.group(1)} px wide at a {WIDTH} px window"

    shot = tmp_path / "report.png"
    done = _run_chromium([f"--window-size={WIDTH},1600", f"--screenshot={shot}", (report_dir / "report.html").as_uri()],
                         tmp_path / "p2")
    assert shot.is_file(), f"no screenshot: {done.stderr[-2000:]}"
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[1] == WIDTH, f"screenshot is {pixels.shape[1]} px wide"
    top = pixels[:400, :, :3]
    assert top.std() > 0.05, "the top of the page rendered blank"
    # text and tables reach into the right half: the summary table spans the page
    assert pixels[:1600, WIDTH // 2:, :3].std() > 0.05, "nothing drawn in the right half of the page"
