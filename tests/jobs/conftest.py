"""What the jobs tests share: a funded org, its "video" project, and fresh job state.

`tenant` (tests/conftest.py) is a client holding a key of this `org`. A module whose
tests need fresh GPU types and empty rate-limit buckets marks itself with
`pytest.mark.usefixtures("fresh_job_state")`.
"""

import pytest

from tests.factories import ProjectFactory
from tests.jobs.factories import funded_org, reset_job_state


@pytest.fixture
def fresh_job_state(db):
    reset_job_state()


@pytest.fixture
def org(db):
    return funded_org()


@pytest.fixture
def project(org):
    return ProjectFactory(org=org, name="video")
