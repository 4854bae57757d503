import pytest
from rest_framework.test import APIClient

from tests.factories import OrgFactory, operator_key, org_key


def client_with(raw_key: str | None) -> APIClient:
    client = APIClient()
    if raw_key:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client


@pytest.fixture
def anonymous():
    return APIClient()


@pytest.fixture
def operator(db):
    return client_with(operator_key())


@pytest.fixture
def org(db):
    return OrgFactory()


@pytest.fixture
def tenant(org):
    """An API client holding a key of `org`."""
    return client_with(org_key(org))
