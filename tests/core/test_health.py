import pytest


@pytest.mark.django_db
def test_readyz_checks_database_and_redis(client):
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["checks"] == {"database": "ok", "redis": "ok"}


def test_healthz_is_up(client):
    assert client.get("/healthz").json() == {"status": "ok"}


def test_metrics_exposes_prometheus_text(client):
    response = client.get("/metrics")
    assert response.status_code == 200
    assert b"python_info" in response.content or b"process_" in response.content


@pytest.mark.django_db
def test_openapi_schema_and_docs_are_served(client):
    schema = client.get("/v1/schema/")
    assert schema.status_code == 200
    assert b"/v1/orgs" in schema.content
    assert client.get("/v1/docs/").status_code == 200


def test_unknown_path_is_json_404(client):
    response = client.get("/v1/nope")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_request_id_is_echoed(client):
    response = client.get("/healthz", HTTP_X_REQUEST_ID="abc123")
    assert response["X-Request-Id"] == "abc123"


@pytest.mark.django_db
def test_an_unknown_admin_page_is_an_admin_html_404_with_its_navigation(admin_client):
    response = admin_client.get("/admin/no-such-app/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")
    body = response.content.decode()
    assert "Page not found" in body
    assert 'href="/admin/"' in body  # the way back: the admin's header and breadcrumbs


def test_an_unknown_api_path_stays_json_beside_the_admin(client):
    response = client.get("/v1/admin/")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
