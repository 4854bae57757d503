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
