"""Headless Chromium for the explorer's tests: Debian's ``chromium`` driven by Playwright."""
from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


@contextmanager
def chromium_page(height: int = 1000) -> Iterator[tuple[object, list[str]]]:
    """A page of a fresh headless Chromium profile, and the console messages in which the page's
    Content-Security-Policy refused something (a test asserts there are none). Skips the test when
    Chromium or Playwright is missing."""
    browser = chromium()
    if browser is None:
        pytest.skip("no chromium executable on PATH (cluster/bootstrap.sh installs Debian's chromium as root)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is a test dependency (.[test])")
    with sync_api.sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        ctx = p.chromium.launch_persistent_context(profile, executable_path=browser, headless=True, args=CHROMIUM_ARGS,
                                                   viewport={"width": 1400, "height": height})
        try:
            page = ctx.new_page()
            refused: list[str] = []
            page.on("console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None)
            yield page, refused
        finally:
            ctx.close()
