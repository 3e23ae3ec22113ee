"""Headless Chromium for the tests that look at pages as a person would.

The browser is Debian's `chromium` (never downloaded at run time: .ci/run installs the
package where it is missing), driven by Playwright. Without either, the tests skip and
say which is missing and how to get it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Headless on a machine without a display or a network: no GPU, no sandbox (the tests may
# run as root), none of Chromium's background connections (refused here, many at a time).
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]  # fmt: skip


def chromium_path() -> str | None:
    explicit = os.environ.get("MULE_CHROMIUM")
    if explicit:
        return explicit
    return next((found for name in CANDIDATES if (found := shutil.which(name))), None)


@contextmanager
def page(width: int = 1280, height: int = 900) -> Iterator:
    """A Playwright page in headless Chromium; skips the test when there is none."""
    executable = chromium_path()
    if executable is None:
        pytest.skip("no Chromium to test the page in: install Debian's package (apt-get install chromium), "
                    "or set MULE_CHROMIUM to a Chromium binary; .ci/run installs it where it can")  # fmt: skip
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Playwright is not installed: pip install -e '.[dev]'")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True, args=ARGS)
        try:
            yield browser.new_page(viewport={"width": width, "height": height})
        finally:
            browser.close()
