"""memfit report: the HTML page of a real watched run, checked in headless Chromium; bad logs.

The browser checks are designed to be able to fail: a control page with an unescaped
`<script>` proves the check sees script execution and console errors, and the screenshot's
pixels must show the plots' line colours.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from helpers import run_cli, run_isolated

CHILDREN = Path(__file__).resolve().parent / "children"

XSS = "<script>window.__pwned=1;document.title='PWNED'</script>"

RUN = CHILDREN / "watched_run.py"


@pytest.fixture(scope="module")
def run_log(tmp_path_factory: pytest.TempPathFactory) -> str:
    log = str(tmp_path_factory.mktemp("report") / "run.jsonl")
    kinds = run_isolated(RUN, env={"MEMFIT_MEMORY": "512MiB"}, args={"log": log, "name": XSS})
    assert "divergence" in kinds
    return log


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's Chromium; installed with apt-get when missing (the machine runs as root)."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None and shutil.which("apt-get") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=600)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "chromium"],
            env=env,
            capture_output=True,
            timeout=900,
        )
        path = shutil.which("chromium")
    if path is None:
        pytest.skip("Chromium is not installed and could not be installed with apt-get")
    return path


def _browse(chromium: str, page: str, screenshot: str | None = None) -> tuple[str, str]:
    """Load `page` in headless Chromium: (the DOM after scripts ran, the console log)."""
    with tempfile.TemporaryDirectory() as profile:
        flags = [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--enable-logging=stderr",
            "--v=0",
            "--hide-scrollbars",
            "--window-size=1050,1600",
            "--virtual-time-budget=2000",
        ]
        if screenshot:
            proc = subprocess.run(
                [*flags, f"--screenshot={screenshot}", f"file://{page}"],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert os.path.exists(screenshot), proc.stderr[-2000:]
        proc = subprocess.run(
            [*flags, "--dump-dom", f"file://{page}"], capture_output=True, text=True, timeout=120
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = "\n".join(line for line in proc.stderr.splitlines() if "CONSOLE" in line)
    return proc.stdout, console


def _png_pixels(path: str) -> np.ndarray:
    """Decode an 8-bit RGB/RGBA PNG (what Chromium writes) into an (height, width, 3) array."""
    with open(path, "rb") as handle:
        data = handle.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    width = height = channels = 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8)
    stride = width * channels
    lines = raw.reshape(height, stride + 1)
    out = np.zeros((height, stride), dtype=np.uint8)
    previous = np.zeros(stride, dtype=np.uint8)
    for y in range(height):
        kind, row = int(lines[y, 0]), lines[y, 1:].copy()
        if kind == 2:  # up: vectorised
            row = row + previous
        elif kind in (1, 3, 4):  # sub, average, paeth: left to right
            r, up = row.tolist(), previous.tolist()
            for i in range(stride):
                a = r[i - channels] if i >= channels else 0
                if kind == 1:
                    r[i] = (r[i] + a) & 255
                elif kind == 3:
                    r[i] = (r[i] + (a + up[i]) // 2) & 255
                else:
                    b, c = up[i], up[i - channels] if i >= channels else 0
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    r[i] = (r[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
            row = np.array(r, dtype=np.uint8)
        out[y] = row
        previous = row
    return out.reshape(height, width, channels)[:, :, :3]


def _count_colour(pixels: np.ndarray, rgb: tuple[int, int, int], tolerance: int = 40) -> int:
    diff = np.abs(pixels.astype(np.int16) - np.array(rgb, dtype=np.int16))
    return int(np.all(diff <= tolerance, axis=2).sum())


def test_report_command_writes_one_self_contained_page(run_log: str, tmp_path) -> None:
    out = str(tmp_path / "page.html")
    proc = run_cli("report", run_log, "--out", out, "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["html_path"] == out
    assert data["summary"]["steps"] == 40 and data["summary"]["peak_bytes"] > 0
    assert data["summary"]["estimate_peak_bytes"] == 40 * 2**20
    assert "divergence" in [f["kind"] for f in data["findings"]]
    page = Path(out).read_text(encoding="utf-8")
    # Nothing to fetch, nothing to run: no scripts, links, images or remote URLs.
    assert not re.search(r"<script|<link|<img|<iframe|src=|@import|url\(", page, re.I)
    assert re.findall(r"https?://[^'\" ]+", page) == ["http://www.w3.org/2000/svg"] * 3
    assert XSS not in page and "&lt;script&gt;window.__pwned=1" in page
    for section in (
        "Findings",
        "Memory",
        "Step time and input wait",
        "Loss",
        "Run configuration",
        "Estimate vs measured",
    ):
        assert f"<h2>{section}</h2>" in page
    assert "remat" in page and "Cause:" in page and "Fix:" in page

    text = run_cli("report", run_log, "--out", out)
    assert text.returncode == 0 and "divergence" in text.stdout and "wrote" in text.stdout


def test_report_renders_in_headless_chromium_and_the_xss_name_is_text(
    run_log: str, chromium: str, tmp_path
) -> None:
    page = str(tmp_path / "report.html")
    assert run_cli("report", run_log, "--out", page).returncode == 0
    shot = str(tmp_path / "report.png")
    dom, console = _browse(chromium, page, screenshot=shot)

    # The control: the same check on a page whose script does run must see it.
    control = str(tmp_path / "control.html")
    with open(control, "w", encoding="utf-8") as handle:
        handle.write(
            f"<html><head><title>t</title></head><body>{XSS}"
            "<script>throw new Error('control-error')</script></body></html>"
        )
    control_dom, control_console = _browse(chromium, control)
    assert "<title>PWNED</title>" in control_dom
    assert "control-error" in control_console

    assert "<title>memfit report: &lt;script&gt;" in dom and "PWNED</title>" not in dom
    assert "&lt;script&gt;window.__pwned=1" in dom  # shown as text in the heading
    assert console == "", console
    # Plots: three SVGs with drawn lines.
    for ident in ("memory", "time", "loss"):
        svg = re.search(rf"<svg id=\"plot-{ident}\".*?</svg>", dom, re.S)
        assert svg, f"no {ident} plot in the DOM"
        points = re.findall(r'points="([^"]+)"', svg.group(0))
        assert points and max(len(p.split()) for p in points) >= 20
    assert 'class="hline"' in dom  # the budget / estimate lines
    # Pixels: the memory (red, blue), step time (green) lines are on the screenshot.
    pixels = _png_pixels(shot)
    assert pixels.shape[1] >= 1000 and pixels.shape[0] >= 1500
    rows = pixels
    assert _count_colour(rows, (0xD6, 0x27, 0x28)) > 200  # peak memory line, marks
    assert _count_colour(rows, (0x1F, 0x77, 0xB4)) > 200  # memory in use after step
    assert _count_colour(rows, (0x2C, 0xA0, 0x2C)) > 100  # step time


def _write(path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_bad_logs_are_one_clear_error_without_traceback(run_log: str, tmp_path) -> None:
    good = Path(run_log).read_text(encoding="utf-8")
    lines = good.splitlines(keepends=True)
    cases = {
        "missing": (str(tmp_path / "nope.jsonl"), "no such file"),
        "folder": (str(tmp_path), "is a folder"),
        "empty": (_write(tmp_path / "empty.jsonl", ""), "is empty"),
        "truncated": (_write(tmp_path / "cut.jsonl", good[: len(lines[0]) + 25]), "cut off"),
        "garbled": (
            _write(tmp_path / "garbled.jsonl", lines[0] + "{not json\n" + "".join(lines[1:])),
            "line 2 is not JSON",
        ),
        "not a watch log": (_write(tmp_path / "other.jsonl", '{"type": "x"}\n'), "header"),
        "binary": (_write(tmp_path / "bin.jsonl", "\x00\x01\x02"), "line 1"),
    }
    for name, (path, expected) in cases.items():
        proc = run_cli("report", path, "--out", str(tmp_path / "x.html"))
        assert proc.returncode == 2, (name, proc.stderr)
        assert proc.stderr.startswith("memfit: error:"), (name, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, (name, proc.stderr)
        assert expected in proc.stderr, (name, proc.stderr)
        assert "Traceback" not in proc.stderr
    unwritable = run_cli("report", run_log, "--out", str(tmp_path / "no" / "dir" / "r.html"))
    assert unwritable.returncode == 2 and "does not exist" in unwritable.stderr


TWO_FITS = CHILDREN / "two_fits.py"


@pytest.fixture(scope="module")
def two_fit_log(tmp_path_factory: pytest.TempPathFactory) -> str:
    log = str(tmp_path_factory.mktemp("report2") / "two.jsonl")
    out = run_isolated(TWO_FITS, env={"MEMFIT_MEMORY": "512MiB"}, args={"log": log})
    assert out == {"runs": 2, "steps": 20}
    return log


def test_a_watch_reused_for_two_fits_appends_a_run_each(two_fit_log: str) -> None:
    lines = [json.loads(line) for line in Path(two_fit_log).read_text().splitlines()]
    headers = [i for i, line in enumerate(lines) if line["type"] == "header"]
    assert len(headers) == 2 and headers[0] == 0
    assert [lines[i]["run"] for i in headers] == [0, 1]
    second = lines[headers[1] :]
    steps = [line["step"] for line in second if line["type"] == "step"]
    assert steps == list(range(20))  # batch 8 over 160 samples, counted from 0 again
    assert [line["type"] for line in lines].count("end") == 2
    proc = run_cli("report", two_fit_log, "--out", two_fit_log + ".html", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert [r["summary"]["steps"] for r in data["runs"]] == [20, 20]
    assert data["summary"]["fits"] == 2 and data["summary"]["steps"] == 40
    text = run_cli("report", two_fit_log, "--out", two_fit_log + ".html")
    assert "fit 1 of 2" in text.stdout and "fit 2 of 2" in text.stdout


def test_report_of_two_fits_renders_both_in_headless_chromium(
    two_fit_log: str, chromium: str, tmp_path
) -> None:
    page = str(tmp_path / "two.html")
    assert run_cli("report", two_fit_log, "--out", page).returncode == 0
    dom, console = _browse(chromium, page)
    assert console == "", console
    assert "Fit 1: " in dom and "Fit 2: " in dom
    for ident in ("memory", "time", "loss", "memory-2", "time-2", "loss-2"):
        svg = re.search(rf"<svg id=\"plot-{ident}\".*?</svg>", dom, re.S)
        assert svg, f"no {ident} plot in the DOM"
        points = re.findall(r'points="([^"]+)"', svg.group(0))
        assert points and max(len(p.split()) for p in points) >= 15, ident
    assert dom.count('class="fit"') >= 2


def test_a_log_without_its_header_is_one_clear_error(two_fit_log: str, tmp_path) -> None:
    lines = Path(two_fit_log).read_text().splitlines(keepends=True)
    headless = _write(tmp_path / "headless.jsonl", "".join(lines[1:]))
    proc = run_cli("report", headless, "--out", str(tmp_path / "x.html"))
    assert proc.returncode == 2 and proc.stderr.startswith("memfit: error:")
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert "header line is missing" in proc.stderr
