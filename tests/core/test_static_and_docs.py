"""The admin's styles and the API docs come from the API process itself, offline.

Before: `/static/admin/css/base.css` was 404 under `make up` (nothing served static
files) and `/v1/docs/` loaded Swagger UI from a CDN, blank without internet. The
middleware serves what any server runs, so the Django test client sees what gunicorn
does; the browser test under tests/ops checks the rendering.
"""

from __future__ import annotations

import re

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def fetch(client: Client, url: str):
    response = client.get(url)
    body = b"".join(response.streaming_content) if response.streaming else response.content
    return response, body


@pytest.mark.parametrize("path", ["/static/admin/css/base.css", "/static/admin/js/core.js"])
def test_the_admins_static_files_are_served(path):
    response, body = fetch(Client(), path)
    assert response.status_code == 200
    assert body


@pytest.mark.parametrize("page", ["/v1/docs/", "/v1/redoc/"])
def test_the_api_docs_load_nothing_from_outside_the_platform(page):
    client = Client()
    response, body = fetch(client, page)
    assert response.status_code == 200
    html = body.decode()
    external = re.findall(r"""(?:src|href)=["'](https?://[^"']+)""", html)
    assert external == [], external
    assets = re.findall(r"""(?:src|href)=["'](/static/[^"']+)""", html)
    assert assets, "the page names no assets of its own"
    for asset in assets:
        asset_response, asset_body = fetch(client, asset.split("?")[0])
        assert asset_response.status_code == 200, asset
        assert asset_body
