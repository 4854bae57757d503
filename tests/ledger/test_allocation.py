"""The pure arithmetic: burn order, draw plans and capture splits at expiry instants."""

import uuid
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from apps.ledger.allocation import Slot, Source, burn_key, plan_draw, share_before, split_capture

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def key(expires_in=None, kind="paid", age=0, bucket_id=None):
    expires_at = None if expires_in is None else T0 + timedelta(seconds=expires_in)
    return burn_key(
        expires_at=expires_at,
        kind=kind,
        created_at=T0 - timedelta(seconds=age),
        bucket_id=bucket_id or uuid.uuid4(),
    )


def test_burn_order_is_expiry_then_kind_then_age_then_id():
    ordered = [
        key(10, "promo"),
        key(10, "grant"),
        key(10, "paid", age=5),
        key(10, "paid"),
        key(99, "paid"),
        key(None, "promo"),
        key(None, "paid"),
    ]
    shuffled = [ordered[i] for i in (3, 6, 0, 5, 1, 4, 2)]
    assert sorted(shuffled) == ordered


def test_a_draw_takes_whole_buckets_in_burn_order_and_nothing_when_short():
    a, b = Source("a", 5, key(10)), Source("b", 5, key(None))
    assert plan_draw([b, a], 7) == [("a", 5), ("b", 2)]
    assert plan_draw([b, a], 10) == [("a", 5), ("b", 5)]
    assert plan_draw([b, a], 11) == []


def test_usage_is_split_at_the_expiry_instant_of_a_bucket():
    since, now = T0, T0 + timedelta(seconds=100)
    promo = Slot("promo", "p", 1000, T0 + timedelta(seconds=60), key(60, "promo"))
    paid = Slot("paid", "q", 1000, None, key(None))
    charged = split_capture(500, [paid, promo], since=since, now=now)
    assert [(s.allocation_id, amount, until) for s, amount, until in charged] == [
        ("promo", 300, promo.expires_at),
        ("paid", 200, now),
    ]
    assert share_before(500, instant=since, since=since, now=now) == 0
    assert share_before(500, instant=now + timedelta(seconds=1), since=since, now=now) == 500


def test_nothing_is_charged_to_a_bucket_that_expired_before_the_window():
    expired = Slot("old", "p", 1000, T0 - timedelta(seconds=1), key(-1, "promo"))
    assert split_capture(500, [expired], since=T0, now=T0 + timedelta(seconds=5)) == []


slots = st.lists(
    st.tuples(st.integers(0, 10_000), st.one_of(st.none(), st.integers(-50, 150))),
    min_size=1,
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(total=st.integers(0, 50_000), specs=slots, window=st.integers(0, 100))
def test_a_capture_split_never_overfills_a_slot_or_charges_after_an_expiry(total, specs, window):
    since, now = T0, T0 + timedelta(seconds=window)
    made = [
        Slot(i, i, room, None if exp is None else T0 + timedelta(seconds=exp), key(exp, "promo"))
        for i, (room, exp) in enumerate(specs)
    ]
    charged = split_capture(total, made, since=since, now=now)
    assert sum(amount for _, amount, _ in charged) <= total
    for slot, amount, until in charged:
        assert 0 < amount <= slot.room
        if slot.expires_at is not None and slot.expires_at <= now:
            assert until == slot.expires_at
            assert amount <= share_before(total, instant=slot.expires_at, since=since, now=now)
    # Whatever was left uncharged had no legal room to go to.
    if sum(a for _, a, _ in charged) < total:
        unexpired_room = sum(s.room for s in made if s.expires_at is None or s.expires_at > now)
        taken_unexpired = sum(
            a for s, a, _ in charged if s.expires_at is None or s.expires_at > now
        )
        assert taken_unexpired == unexpired_room
