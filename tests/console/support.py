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


def address(gw, name: str) -> tuple[str, int]:  # noqa: ANN001 - a gateway.server.Gateway
    """(host, port) of the gateway's `name` listener."""
    host, port = next(a for a in gw.adapters if a.name == name).address.rsplit(":", 1)
    return host, int(port)


class Console:
    """One browser page on the gateway's console; `open` waits until the page has rendered."""

    def __init__(self, page, base: str, shots: Shots) -> None:  # noqa: ANN001 - a playwright Page
        self.page, self.base, self.shots = page, base, shots
        self.errors: list[str] = []
        page.on("pageerror", lambda e: self.errors.append(str(e)))

    async def open(self, route: str, shot: str | None = None) -> str:
        await self.page.evaluate("document.querySelector('main')?.removeAttribute('data-ready')")
        target = f"{self.base}/console#/{route}"
        if self.page.url == target:  # (the same hash: no hashchange, so load the page again)
            await self.page.reload()
        else:
            await self.page.goto(target)
        await self.page.wait_for_selector("main[data-ready]")
        ready = await self.page.get_attribute("main", "data-ready")
        assert ready != "error", await self.page.inner_text("main")
        if shot:
            await self.shots.take(self.page, shot)
        return await self.page.inner_text("main")

    async def rows(self, table_id: str) -> list[list[str]]:
        """The cells of a table's body rows, as text."""
        texts = await self.page.locator(f"#{table_id} tbody tr").all_inner_texts()
        return [t.split("\t") for t in texts]
