"""Admission control: the Redis token buckets and the per-org limits."""

import pytest
import redis
from django.test import override_settings
from redis.backoff import NoBackoff
from redis.retry import Retry

from apps.accounts.models import Tier
from apps.core import redis as core_redis
from apps.core.errors import RateLimited
from apps.jobs.services import admission
from tests.factories import OrgFactory

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_job_state")]


def test_org_overrides_win_over_tier_defaults():
    plain = admission.org_limits(OrgFactory(tier=Tier.FREE))
    assert (plain.max_queued, plain.rate_per_s, plain.burst) == (20, 2.0, 10)
    tuned = admission.org_limits(
        OrgFactory(tier=Tier.FREE, max_queued_jobs=3, rate_per_s=7.5, rate_burst=30)
    )
    assert (tuned.max_queued, tuned.max_running, tuned.rate_per_s, tuned.burst) == (3, 4, 7.5, 30)


@override_settings(GANTRY_TIER_AGGREGATE_RATE={"free": {"rate_per_s": 0.01, "burst": 3}})
def test_a_refused_submission_draws_from_no_bucket():
    first = OrgFactory(tier=Tier.FREE, rate_per_s=0.01, rate_burst=1)
    admission.check_rate(first)
    with pytest.raises(RateLimited):
        admission.check_rate(first)  # its own bucket is empty: the tier's is not drawn
    admission.check_rate(OrgFactory(tier=Tier.FREE))
    admission.check_rate(OrgFactory(tier=Tier.FREE))
    with pytest.raises(RateLimited) as refused:
        admission.check_rate(OrgFactory(tier=Tier.FREE))
    assert refused.value.retry_after >= 1


def test_paid_orgs_have_no_tier_wide_bucket():
    for _ in range(3):
        org = OrgFactory(tier=Tier.PAID, rate_per_s=0.01, rate_burst=1)
        admission.check_rate(org)
    assert not admission.redis_client().exists(admission.tier_bucket_key(Tier.PAID))


def test_rate_limits_fail_open_when_redis_is_unreachable(monkeypatch):
    dead = redis.Redis(host="127.0.0.1", port=1, retry=Retry(NoBackoff(), 0))
    monkeypatch.setattr(core_redis, "_client", dead)
    monkeypatch.setattr(admission, "_bucket_script", dead.register_script("return 0"))
    monkeypatch.setattr(admission, "_redis_down_until", 0.0)
    org = OrgFactory(tier=Tier.FREE, rate_per_s=0.01, rate_burst=1)
    for _ in range(3):
        admission.admit(org)  # no exception: admitted, and the outage is logged
    # The outage is remembered: the next submissions do not wait on Redis again.
    assert not admission._redis_available()
