"""Issuing credit into buckets, expiring it, correcting it."""

from datetime import timedelta

import pytest
from django.db.models.functions import Now
from django.utils import timezone

from apps.core.errors import Conflict, GantryError, InsufficientCredits
from apps.ledger import services
from apps.ledger.models import Bucket, BucketKind, Entry
from tests.factories import OrgFactory, ProjectFactory
from tests.ledger.factories import CREDIT, BucketFactory, HoldFactory

pytestmark = pytest.mark.django_db


def test_a_grant_issues_credit_recorded_by_a_balanced_issue_entry(assert_ledger_consistent):
    bucket = BucketFactory(granted=5 * CREDIT, kind=BucketKind.PROMO)
    legs = list(Entry.objects.filter(bucket=bucket).values_list("kind", "account", "amount"))
    assert sorted(legs) == [("issue", "available", 5 * CREDIT), ("issue", "issued", -5 * CREDIT)]
    assert (bucket.remaining, bucket.kind_rank) == (5 * CREDIT, 0)
    assert_ledger_consistent()


def test_the_same_grant_key_returns_the_first_bucket_and_issues_nothing_more():
    org = OrgFactory()
    first = services.grant(org=org, amount=CREDIT, kind="paid", idempotency_key="purchase-1")
    again = services.grant(org=org, amount=CREDIT, kind="paid", idempotency_key="purchase-1")
    assert again.pk == first.pk
    assert Bucket.objects.filter(org=org).count() == 1
    assert Entry.objects.filter(org=org).count() == 2


def test_the_same_grant_key_for_a_different_grant_is_a_conflict():
    org = OrgFactory()
    services.grant(org=org, amount=CREDIT, kind="paid", idempotency_key="purchase-1")
    with pytest.raises(Conflict):
        services.grant(org=org, amount=2 * CREDIT, kind="paid", idempotency_key="purchase-1")
    # Keys are per org: another org may use the same one.
    other = services.grant(
        org=OrgFactory(), amount=2 * CREDIT, kind="paid", idempotency_key="purchase-1"
    )
    assert other.granted == 2 * CREDIT


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"amount": 0}, "amount"),
        ({"amount": -5}, "amount"),
        ({"amount": 1.5}, "amount"),
        ({"amount": True}, "amount"),
        ({"kind": "gift"}, "kind"),
        ({"expires_at": timezone.now() - timedelta(seconds=1)}, "expires_at"),
        ({"idempotency_key": ""}, "idempotency_key"),
    ],
)
def test_an_invalid_grant_is_refused_naming_the_field(changes, field):
    org = OrgFactory()
    with pytest.raises(GantryError) as refused:
        services.grant(**{"org": org, "amount": CREDIT, "kind": "paid", **changes})
    assert refused.value.field == field
    assert not Bucket.objects.filter(org=org).exists()


def test_a_grant_to_another_orgs_project_is_refused():
    with pytest.raises(GantryError) as refused:
        services.grant(org=OrgFactory(), project=ProjectFactory(), amount=1, kind="paid")
    assert refused.value.field == "project"


def test_expiry_moves_what_is_left_to_expired_once_and_leaves_the_held_part(
    assert_ledger_consistent,
):
    org = OrgFactory()
    soon = timezone.now() + timedelta(hours=1)
    promo = BucketFactory(org=org, kind=BucketKind.PROMO, granted=10 * CREDIT, expires_at=soon)
    untouched = BucketFactory(org=org, expires_at=soon + timedelta(days=1))
    hold = HoldFactory(org=org, amount=4 * CREDIT)
    Bucket.objects.filter(pk=promo.pk).update(expires_at=Now())

    assert services.expire_buckets() == 1
    assert services.expire_buckets() == 0
    promo.refresh_from_db()
    assert (promo.expired, promo.held, promo.remaining) == (6 * CREDIT, 4 * CREDIT, 0)
    assert promo.expired_at is not None
    untouched.refresh_from_db()
    assert untouched.expired_at is None and untouched.expired == 0
    services.settle(hold, reason="done", final_usage=CREDIT)
    assert_ledger_consistent()


def test_a_bucket_past_its_expiry_is_never_drawn_even_before_the_expiry_task_runs():
    org = OrgFactory()
    promo = BucketFactory(org=org, kind=BucketKind.PROMO, granted=10 * CREDIT)
    Bucket.objects.filter(pk=promo.pk).update(expires_at=Now())
    with pytest.raises(InsufficientCredits):
        services.reserve(org=org, amount=1, idempotency_key="k")


def test_an_operator_adjustment_corrects_a_bucket_both_ways(assert_ledger_consistent):
    bucket = BucketFactory(granted=10 * CREDIT)
    services.adjust(bucket=bucket, amount=3 * CREDIT, reason="goodwill", actor="ops")
    services.adjust(bucket=bucket, amount=-5 * CREDIT, reason="chargeback", actor="ops")
    assert (bucket.granted, bucket.remaining) == (8 * CREDIT, 8 * CREDIT)
    with pytest.raises(GantryError) as refused:
        services.adjust(bucket=bucket, amount=-9 * CREDIT, reason="too much")
    assert refused.value.field == "amount"
    assert Entry.objects.filter(bucket=bucket, kind="adjustment").count() == 4
    assert_ledger_consistent()
