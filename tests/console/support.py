"""The console tests' browser: Debian's Chromium (deps/debian-packages.txt) driven by Playwright's
Python package (its own browser download is not available here, so it launches /usr/bin/chromium),
and where the page screenshots go: `CONSOLE_SCREENSHOTS_DIR` (a test artifact), else the test's
temporary directory; `UPDATE_CONSOLE_DOCS=1` also copies them to docs/console/ (docs/console.md
shows them)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("CONSOLE_CHROMIUM", "/usr/bin/chromium")
DOCS = Path(__file__).resolve().parents[2] / "docs" / "console"
# As the environment notes advise for a closed network: no background or first-run traffic.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

needs_chromium = pytest.mark.skipif(
    not os.path.exists(CHROMIUM),
    reason=f"{CHROMIUM} missing: `make install-system` installs Debian's chromium",
)


class Shots:
    """Saves one screenshot per page."""

    def __init__(self, tmp: Path) -> None:
        self.dir = Path(os.environ.get("CONSOLE_SCREENSHOTS_DIR") or tmp / "screenshots")
        self.dir.mkdir(parents=True, exist_ok=True)

    async def take(self, page, name: str) -> Path:  # noqa: ANN001 - a playwright Page
        path = self.dir / f"{name}.png"
        await page.screenshot(path=str(path), full_page=True)
        assert path.stat().st_size > 1000
        if os.environ.get("UPDATE_CONSOLE_DOCS") == "1":
            DOCS.mkdir(exist_ok=True)
            shutil.copy(path, DOCS / path.name)
        return path
