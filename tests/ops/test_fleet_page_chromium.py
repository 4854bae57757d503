"""The fleet page as an operator sees it: headless Chromium logs in through the real admin
login form, opens the fleet, drains a node with its button, and keeps a screenshot as a
test artifact (artifacts/fleet-page.png).

Needs Debian's `chromium` and `chromium-driver` (apt-get install -y chromium
chromium-driver); where either binary is missing the test skips and says which.
"""

from __future__ import annotations

import io
import sys
import uuid

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from PIL import Image
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ready
from selenium.webdriver.support.ui import WebDriverWait

from apps.accounts.models import OperatorAction
from apps.fleet.models import Node, NodeState
from tests.jobs.factories import reset_job_state
from tests.ops.audit_world import platform
from tests.ops.chromium import MISSING, SKIP_REASON, headless_chromium
from tests.scheduler.factories import broker

ARTIFACT = settings.BASE_DIR / "artifacts" / "fleet-page.png"
AUDIT_ARTIFACT = settings.BASE_DIR / "artifacts" / "audit-trail.png"

if MISSING:
    print(f"SKIP test_fleet_page_chromium: {SKIP_REASON}", file=sys.stderr)
    pytest.skip(SKIP_REASON, allow_module_level=True)

# The live server runs in another thread: data must be committed for it to see.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def chromium(tmp_path):
    driver = headless_chromium(tmp_path / "profile")
    try:
        yield driver
    finally:
        driver.quit()


def _screenshot(driver, path) -> None:
    """The whole page: the window grows to the document's height (within reason)."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, max(900, min(int(height) + 140, 4000)))
    assert driver.save_screenshot(str(path))


def test_the_fleet_page_in_headless_chromium_shows_what_runs_where(live_server, chromium, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast login
    reset_job_state()
    world = platform()
    password = uuid.uuid4().hex
    get_user_model().objects.create_superuser("ops", "ops@example.com", password)
    wait = WebDriverWait(chromium, 20)
    try:
        chromium.get(f"{live_server.url}/admin/login/?next=/admin/fleet/node/fleet/")
        chromium.find_element(By.NAME, "username").send_keys("ops")
        chromium.find_element(By.NAME, "password").send_keys(password)
        chromium.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
        wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, ".fleet-node")))

        # Drain the idle node with its button, as an operator would.
        idle = chromium.find_element(By.ID, f"node-{world.idle_node.name}")
        idle.find_element(By.CSS_SELECTOR, "button[value=drain]").click()
        wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, ".messagelist .success")))
        html = chromium.page_source

        ARTIFACT.parent.mkdir(exist_ok=True)
        _screenshot(chromium, ARTIFACT)

        # The drain is the newest row of the audit trail.
        chromium.get(f"{live_server.url}/admin/scheduler/dispatchdecision/audit/")
        wait.until(ready.presence_of_element_located((By.ID, "audit-table")))
        newest = chromium.find_element(By.CSS_SELECTOR, "#audit-table tbody tr")
        audit_row = newest.text
        _screenshot(chromium, AUDIT_ARTIFACT)
    finally:
        for node in (world.busy_node, world.idle_node):
            broker().delete(f"node.{node.name}")  # run messages the dispatch published

    assert world.busy_node.name in html and world.idle_node.name in html
    assert world.paid.name in html  # the org whose job holds the busy node's GPUs
    assert str(world.running.pk) in html  # the job link (and its title)
    assert f"Node {world.idle_node.name} is now draining" in html
    assert Node.objects.get(pk=world.idle_node.pk).state == NodeState.DRAINING
    drain = OperatorAction.objects.get(action="node.drain", actor="operator:ops")
    assert drain.target_id == world.idle_node.name
    assert "operator.node.drain" in audit_row and "operator:ops" in audit_row
    assert AUDIT_ARTIFACT.stat().st_size > 20_000
    png = ARTIFACT.read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 20_000
    with Image.open(io.BytesIO(png)) as image:
        assert image.width == 1400 and image.height >= 800
        colours = image.convert("RGB").resize((140, 90)).getcolors(maxcolors=100_000)
        assert len(colours) > 50  # a rendered page with styles, not a blank canvas
