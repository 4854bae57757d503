"""The operator's pages as `make up` serves them, in headless Chromium (not live_server,
which serves static files itself and so hid that nothing else did): the admin login and
the org, job and fleet pages load their CSS (200), a job's id is one line of the job
list, and `/v1/docs/` renders its operations with every request staying on this machine.
Screenshots: artifacts/.

Needs Debian's `chromium` and `chromium-driver`; without them the test skips and says
which to install (.ci/run installs them where it can).
"""

from __future__ import annotations

import json
import sys
import uuid
from urllib.parse import urlsplit

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ready
from selenium.webdriver.support.ui import WebDriverWait

from tests.ops.chromium import MISSING, SKIP_REASON, headless_chromium
from tests.ops.launched import call, funded_tenant_key
from tests.worker_harness import ROOT

ARTIFACTS = ROOT / "artifacts"
if MISSING:
    print(f"SKIP test_platform_in_chromium: {SKIP_REASON}", file=sys.stderr)
    pytest.skip(SKIP_REASON, allow_module_level=True)

pytestmark = pytest.mark.e2e


@pytest.fixture
def chromium(tmp_path):
    driver = headless_chromium(tmp_path / "profile", performance_log=True)
    try:
        yield driver
    finally:
        driver.quit()


def requests_made(driver) -> list[tuple[str, int | None]]:
    """(url, status) of every request the pages made since the last call."""
    sent, answered = [], {}
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        params = message.get("params", {})
        if message["method"] == "Network.requestWillBeSent":
            url = params["request"]["url"]
            if url.startswith(("http://", "https://", "ws://", "wss://")):  # not chrome://
                sent.append((params["requestId"], url))
        elif message["method"] == "Network.responseReceived":
            answered[params["requestId"]] = params["response"]["status"]
    return [(url, answered.get(request_id)) for request_id, url in sent]


def shoot(driver, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, max(900, min(int(height) + 140, 4000)))
    assert driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))


def test_the_admin_and_the_api_docs_are_styled_and_stay_on_this_machine(platform, chromium):
    password = uuid.uuid4().hex
    made = platform.manage(
        "shell",
        "-c",
        "from django.contrib.auth import get_user_model; "
        f"get_user_model().objects.create_superuser('ops', 'ops@example.com', '{password}')",
    )
    assert made.returncode == 0, made.stderr
    body = {"name": "acme-ui", "tier": "paid"}
    assert call(f"{platform.api}/v1/orgs", key=platform.operator_key, body=body)[0] == 201
    job = {"project": "video", "params": {"prompt": "a row"}, "max_runtime_s": 60}
    assert call(f"{platform.api}/v1/jobs", key=funded_tenant_key(platform), body=job)[0] == 202
    host = urlsplit(platform.api).hostname
    wait = WebDriverWait(chromium, 30)

    chromium.get(f"{platform.api}/admin/login/")
    chromium.find_element(By.NAME, "username").send_keys("ops")
    chromium.find_element(By.NAME, "password").send_keys(password)
    chromium.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait.until(ready.presence_of_element_located((By.ID, "site-name")))
    shoot(chromium, "admin-home")
    pages = {
        "admin-orgs": "/admin/accounts/org/",
        "admin-jobs": "/admin/jobs/job/",
        "admin-fleet": "/admin/fleet/node/fleet/",
    }
    seen: list[tuple[str, int | None]] = requests_made(chromium)
    for name, path in pages.items():
        chromium.get(f"{platform.api}{path}")
        wait.until(ready.presence_of_element_located((By.ID, "content")))
        if name == "admin-fleet":  # every node's worker pool says it is alive
            assert "worker h100-1@" in chromium.page_source, "no pulse from h100-1's worker"
            assert "no worker seen" not in chromium.page_source
        if name == "admin-jobs":  # a job's id (a UUID operators copy whole) on one line
            lines = chromium.execute_script(
                "return document.querySelector('#result_list th.field-id a')"
                ".getClientRects().length"
            )
            assert lines == 1, f"the job's id wraps over {lines} lines"
        shoot(chromium, name)
        seen += requests_made(chromium)
    if "acme-ui" not in chromium.page_source:
        chromium.get(f"{platform.api}/admin/accounts/org/")
        assert "acme-ui" in chromium.page_source

    chromium.get(f"{platform.api}/v1/docs/")
    wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, ".opblock")))
    operations = chromium.find_elements(By.CSS_SELECTOR, ".opblock")
    shoot(chromium, "api-docs")
    seen += requests_made(chromium)

    css = [(url, status) for url, status in seen if url.split("?")[0].endswith(".css")]
    assert css, "no stylesheet was requested"
    assert all(status == 200 for _, status in css), css
    assert any("/static/admin/css/base.css" in url for url, _ in css)
    elsewhere = [url for url, _ in seen if urlsplit(url).hostname not in (host, None)]
    assert elsewhere == [], elsewhere  # no CDN, no fonts: works offline
    assert len(operations) > 20  # the whole API, rendered
