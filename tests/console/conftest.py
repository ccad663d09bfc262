"""The console tests' browser: one headless Chromium per test (tests/console/support.py)."""

from __future__ import annotations

import pytest

from tests.console.support import CHROMIUM, CHROMIUM_ARGS


@pytest.fixture
async def browser():
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            await b.close()
