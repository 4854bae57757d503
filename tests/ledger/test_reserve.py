"""Reserving credit: burn order, scope, idempotency, insufficient credit, extension."""

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as examples
from hypothesis import strategies as st

from apps.core.errors import Conflict, GantryError, InsufficientCredits
from apps.ledger import services
from apps.ledger.allocation import Source, burn_key, plan_draw
from apps.ledger.models import Bucket, Entry, Hold, HoldAllocation
from tests.factories import OrgFactory, ProjectFactory, UserFactory
from tests.ledger.factories import CREDIT, BucketFactory, HoldFactory

pytestmark = pytest.mark.django_db


def drawn(hold) -> list:
    """[(bucket, amount)] of the hold, in the order the buckets were drawn (burn order)."""
    entries = Entry.objects.filter(hold=hold, kind="hold", account="held").order_by("id")
    return [(e.bucket_id, e.amount) for e in entries]


def test_burn_order_is_earliest_expiry_first_then_promo_grant_paid_then_age():
    org = OrgFactory()
    soon = timezone.now() + timedelta(days=1)
    later = timezone.now() + timedelta(days=9)
    never_paid = BucketFactory(org=org, kind="paid", granted=CREDIT)
    never_promo = BucketFactory(org=org, kind="promo", granted=CREDIT)
    later_promo = BucketFactory(org=org, kind="promo", granted=CREDIT, expires_at=later)
    soon_paid = BucketFactory(org=org, kind="paid", granted=CREDIT, expires_at=soon)
    soon_grant = BucketFactory(org=org, kind="grant", granted=CREDIT, expires_at=soon)
    soon_promo_old = BucketFactory(org=org, kind="promo", granted=CREDIT, expires_at=soon)
    soon_promo_new = BucketFactory(org=org, kind="promo", granted=CREDIT, expires_at=soon)

    hold = HoldFactory(org=org, amount=7 * CREDIT)

    order = [
        soon_promo_old,
        soon_promo_new,
        soon_grant,
        soon_paid,
        later_promo,
        never_promo,
        never_paid,
    ]
    assert drawn(hold) == [(b.pk, CREDIT) for b in order]


def test_a_partial_draw_takes_the_highest_ranked_bucket_first_and_tops_up_from_the_next():
    org = OrgFactory()
    paid = BucketFactory(org=org, kind="paid", granted=10 * CREDIT)
    promo = BucketFactory(org=org, kind="promo", granted=3 * CREDIT)
    hold = HoldFactory(org=org, amount=5 * CREDIT)
    assert drawn(hold) == [(promo.pk, 3 * CREDIT), (paid.pk, 2 * CREDIT)]


def test_project_buckets_serve_only_their_project_and_org_wide_ones_serve_all():
    org = OrgFactory()
    video, audio = ProjectFactory(org=org), ProjectFactory(org=org)
    video_only = BucketFactory(org=org, project=video, kind="promo", granted=2 * CREDIT)
    org_wide = BucketFactory(org=org, granted=2 * CREDIT)

    assert drawn(HoldFactory(org=org, project=video, amount=3 * CREDIT)) == [
        (video_only.pk, 2 * CREDIT),
        (org_wide.pk, CREDIT),
    ]
    with pytest.raises(InsufficientCredits):
        HoldFactory(org=org, project=audio, amount=2 * CREDIT)
    with pytest.raises(InsufficientCredits):
        HoldFactory(org=org, amount=2 * CREDIT)  # no project: org-wide buckets only
    assert drawn(HoldFactory(org=org, project=audio, amount=CREDIT)) == [(org_wide.pk, CREDIT)]


def test_not_enough_credit_is_402_and_holds_nothing():
    org = OrgFactory()
    bucket = BucketFactory(org=org, granted=3 * CREDIT)
    with pytest.raises(InsufficientCredits) as refused:
        services.reserve(org=org, amount=4 * CREDIT, idempotency_key="big")
    assert refused.value.status_code == 402
    assert "3000000 µc available" in refused.value.message
    bucket.refresh_from_db()
    assert (bucket.held, bucket.remaining) == (0, 3 * CREDIT)
    assert not Hold.objects.filter(org=org).exists()
    assert Entry.objects.filter(org=org, kind="hold").count() == 0
    # The key was not used up by the refusal: with credit it works.
    BucketFactory(org=org, granted=CREDIT)
    assert services.reserve(org=org, amount=4 * CREDIT, idempotency_key="big").amount == 4 * CREDIT


def test_the_same_key_returns_the_same_hold_even_after_it_settled():
    org = OrgFactory()
    BucketFactory(org=org, granted=10 * CREDIT)
    first = services.reserve(org=org, amount=CREDIT, idempotency_key="job-1")
    services.settle(first, reason="done", final_usage=0)
    again = services.reserve(org=org, amount=CREDIT, idempotency_key="job-1")
    assert again.pk == first.pk and again.state == "settled"
    assert Hold.objects.filter(org=org).count() == 1


@pytest.mark.parametrize("change", ["amount", "project", "user"])
def test_the_same_key_with_a_different_reservation_is_a_conflict(change):
    org = OrgFactory()
    BucketFactory(org=org, granted=10 * CREDIT)
    services.reserve(org=org, amount=CREDIT, idempotency_key="job-1")
    other = {"amount": 2 * CREDIT, "project": ProjectFactory(org=org), "user": UserFactory(org=org)}
    with pytest.raises(Conflict) as refused:
        services.reserve(
            **{"org": org, "amount": CREDIT, "idempotency_key": "job-1", change: other[change]}
        )
    assert refused.value.status_code == 409
    assert Hold.objects.filter(org=org).count() == 1


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"amount": 0}, "amount"),
        ({"amount": 2.5}, "amount"),
        ({"idempotency_key": ""}, "idempotency_key"),
        ({"idempotency_key": "k" * 256}, "idempotency_key"),
        ({"expires_at": timezone.now() - timedelta(minutes=1)}, "expires_at"),
    ],
)
def test_an_invalid_reservation_is_refused_naming_the_field(changes, field):
    org = OrgFactory()
    BucketFactory(org=org)
    with pytest.raises(GantryError) as refused:
        services.reserve(**{"org": org, "amount": CREDIT, "idempotency_key": "k", **changes})
    assert refused.value.field == field
    assert not Hold.objects.filter(org=org).exists()


def test_a_project_or_user_of_another_org_is_refused():
    org = OrgFactory()
    BucketFactory(org=org)
    for scope in ({"project": ProjectFactory()}, {"user": UserFactory()}):
        with pytest.raises(GantryError) as refused:
            services.reserve(org=org, amount=1, idempotency_key="k", **scope)
        assert refused.value.field == next(iter(scope))


def test_a_hold_expires_by_default_after_the_configured_ttl(settings):
    settings.GANTRY_LEDGER_HOLD_TTL_S = 600
    org = OrgFactory()
    BucketFactory(org=org)
    hold = services.reserve(org=org, amount=1, idempotency_key="k")
    assert hold.expires_at - hold.created_at == timedelta(seconds=600)
    assert Hold.objects.get(pk=hold.pk).expires_at == hold.expires_at


def test_extend_tops_up_in_burn_order_and_pushes_back_the_expiry(assert_ledger_consistent):
    org = OrgFactory()
    paid = BucketFactory(org=org, granted=10 * CREDIT)
    hold = HoldFactory(org=org, amount=2 * CREDIT)
    promo = BucketFactory(org=org, kind="promo", granted=CREDIT)
    later = hold.expires_at + timedelta(hours=1)

    services.extend(hold, amount=3 * CREDIT, expires_at=later)

    assert (hold.amount, hold.requested_amount, hold.expires_at) == (5 * CREDIT, 2 * CREDIT, later)
    split = dict(HoldAllocation.objects.filter(hold=hold).values_list("bucket_id", "amount"))
    assert split == {paid.pk: 4 * CREDIT, promo.pk: CREDIT}
    # A replayed reserve still matches the original request, not the extended amount.
    assert services.reserve(org=org, amount=2 * CREDIT, idempotency_key=hold.idempotency_key)
    assert_ledger_consistent()


def test_extend_without_credit_is_402_and_a_closed_hold_cannot_be_extended():
    org = OrgFactory()
    BucketFactory(org=org, granted=3 * CREDIT)
    hold = HoldFactory(org=org, amount=2 * CREDIT)
    with pytest.raises(InsufficientCredits):
        services.extend(hold, amount=2 * CREDIT)
    hold.refresh_from_db()
    assert hold.amount == 2 * CREDIT
    services.release(hold, reason="cancelled")
    with pytest.raises(Conflict):
        services.extend(hold, amount=CREDIT)


bucket_specs = st.lists(
    st.tuples(
        st.sampled_from(["paid", "promo", "grant"]),
        st.integers(1, 50),
        st.one_of(st.none(), st.integers(1, 3)),
    ),
    min_size=1,
    max_size=6,
)


@examples(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(specs=bucket_specs, amount=st.integers(1, 200))
def test_reserve_draws_exactly_what_the_burn_order_rule_prescribes(specs, amount):
    """The database draws (reserve, in SQL) and the Python rule (extend, the model)
    agree on every bucket set."""
    with transaction.atomic():
        org = OrgFactory()
        soon = timezone.now() + timedelta(days=1)
        buckets = [
            BucketFactory(
                org=org,
                kind=kind,
                granted=granted,
                expires_at=soon + timedelta(days=days) if days else None,
            )
            for kind, granted, days in specs
        ]
        expected = plan_draw(
            [
                Source(
                    b.pk,
                    b.remaining,
                    burn_key(
                        expires_at=b.expires_at,
                        kind=b.kind,
                        created_at=b.created_at,
                        bucket_id=b.pk,
                    ),
                )
                for b in Bucket.objects.filter(pk__in=[b.pk for b in buckets])
            ],
            amount,
        )
        try:
            hold = services.reserve(org=org, amount=amount, idempotency_key="k")
        except InsufficientCredits:
            assert expected == []
        else:
            assert drawn(hold) == expected
        transaction.set_rollback(True)
