"""Headless Chromium for the browser tests (Debian's chromium and chromium-driver)."""

from __future__ import annotations

import shutil

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
MISSING = [n for n, p in (("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER)) if not p]
SKIP_REASON = f"{' and '.join(MISSING)} not installed: apt-get install -y chromium chromium-driver"


def headless_chromium(profile_dir, *, performance_log: bool = False) -> webdriver.Chrome:
    """A headless Chromium with its own profile, no background traffic of its own."""
    options = Options()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",  # root in a container
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,1000",
        f"--user-data-dir={profile_dir}",
    ):
        options.add_argument(flag)
    if performance_log:
        options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    return driver
