"""`workbench screenshot REPORT_FOLDER`: the report's first screen as a reader sees it, as a PNG
(first-screen.png beside index.html): the page in headless Chromium at a window size, 1400 x 900
by default (a laptop's browser window).

Chromium is the browser the tests check the layout in (tests/recipes/test_report.py); it is found on
PATH under its usual names, and its absence is one line naming them.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from workbench.errors import WorkbenchError

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Headless and offline: no sandbox (containers run as root), no GPU, nothing fetched or synced.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars")
FIRST_SCREEN = "first-screen.png"


def find_chromium() -> str:
    found = next((path for path in map(shutil.which, CHROMIUM_NAMES) if path), None)
    if found is None:
        raise WorkbenchError(f"screenshot: no Chromium on PATH (looked for {', '.join(CHROMIUM_NAMES)}): "
                             "install one, e.g. apt-get install chromium")
    return found


def chromium(*args: str, timeout: float = 120) -> str:
    """Run headless Chromium with a throwaway profile; its stdout (e.g. --dump-dom). Past
    `timeout` seconds of wall time it is taken for hung (a page takes a few)."""
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run([find_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise WorkbenchError(f"screenshot: chromium exited with {done.returncode}: "
                             f"{(done.stderr.strip().splitlines() or ['no message'])[-1]}")
    return done.stdout


def screenshot(report: str | Path, out: str | Path | None = None, width: int = 1400, height: int = 900,
               timeout: float = 120) -> Path:
    """Write the first `width` x `height` pixels of REPORT/index.html (or of the page given) to
    `out` (default REPORT/first-screen.png); returns its path. `timeout`: as `chromium`'s."""
    report = Path(report)
    index = report / "index.html" if report.is_dir() else report
    if not index.is_file():
        raise WorkbenchError(f"screenshot: {index} is not a report page (give a report folder holding index.html)")
    png = Path(out) if out is not None else index.parent / FIRST_SCREEN
    png.parent.mkdir(parents=True, exist_ok=True)
    chromium(f"--window-size={width},{height}", "--virtual-time-budget=3000", f"--screenshot={png.resolve()}",
             index.resolve().as_uri(), timeout=timeout)
    return png
