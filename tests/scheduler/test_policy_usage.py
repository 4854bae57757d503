"""Decayed usage and max-min entitlements."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apps.scheduler.policy import DecayedUsage, PolicyConfig, accrue, decay, water_fill
from apps.scheduler.policy.usage import equivalent_gpus


def test_usage_halves_every_half_life():
    assert decay(1000.0, 600.0, 600.0) == pytest.approx(500.0)
    assert decay(1000.0, 1800.0, 600.0) == pytest.approx(125.0)
    assert decay(1000.0, 0.0, 600.0) == 1000.0


def test_accrue_decays_then_adds_and_is_order_independent():
    once = accrue(100.0, as_of=0.0, now=600.0, gpu_seconds=30.0, half_life_s=600.0)
    assert once == pytest.approx(80.0)
    stepwise = accrue(100.0, 0.0, 600.0, 10.0, 600.0)
    stepwise = accrue(stepwise, 600.0, 600.0, 20.0, 600.0)
    assert stepwise == pytest.approx(once)


def test_holding_gpus_steadily_converges_to_their_equivalent():
    usage, half_life = 0.0, 300.0
    for second in range(1, 20_000):
        usage = accrue(usage, second - 1, second, 4.0, half_life)
    assert equivalent_gpus(usage, half_life) == pytest.approx(4.0, rel=0.01)


def test_decayed_usage_ledger_keeps_tier_org_and_user_levels():
    ledger = DecayedUsage(half_life_s=100.0)
    ledger.add(0.0, "paid", "acme", "ann", 50.0)
    ledger.add(0.0, "paid", "acme", "bob", 30.0)
    ledger.add(100.0, "free", "zed", "zoe", 10.0)
    view = ledger.snapshot(100.0)
    assert view.by_tier["paid"] == pytest.approx(40.0)
    assert view.by_org["acme"] == pytest.approx(40.0)
    assert view.by_user[("acme", "ann")] == pytest.approx(25.0)
    assert view.by_org.get("nobody", 0.0) == 0.0
    assert ledger.snapshot(200.0).by_tier["free"] == pytest.approx(5.0)


def test_decayed_usage_survives_rebasing_over_long_horizons():
    ledger = DecayedUsage(half_life_s=1.0)
    ledger.add(0.0, "free", "o", "u", 1.0)
    ledger.add(1000.0, "free", "o", "u", 8.0)  # 1000 half-lives later: rebased, no overflow
    assert ledger.snapshot(1001.0).by_org["o"] == pytest.approx(4.0)
    assert math.isfinite(ledger.snapshot(5000.0).by_org["o"])


def test_water_fill_gives_nobody_more_than_it_asks_and_shares_the_rest_by_weight():
    shares = water_fill(100.0, {"e": 10.0, "p": 80.0, "f": 80.0}, {"e": 6.0, "p": 3.0, "f": 1.0})
    assert shares["e"] == pytest.approx(10.0)
    assert shares["p"] == pytest.approx(67.5)
    assert shares["f"] == pytest.approx(22.5)


def test_water_fill_respects_ceilings_and_floors():
    shares = water_fill(
        100.0,
        {"e": 100.0, "f": 100.0},
        {"e": 9.0, "f": 1.0},
        floors={"f": 20.0},
        ceilings={"e": 70.0},
    )
    assert shares["e"] == pytest.approx(70.0)
    assert shares["f"] == pytest.approx(30.0)


def _progressive_filling(capacity, demands, weights):
    """Max-min fairness the slow, obvious way: raise everyone unsatisfied by the same
    level per unit of weight until the capacity or every demand runs out."""
    share = dict.fromkeys(demands, 0.0)
    left = capacity
    active = {key for key, demand in demands.items() if demand > 0}
    while active and left > 1e-9:
        weight = sum(weights[key] for key in active)
        step = min(left / weight, *((demands[k] - share[k]) / weights[k] for k in active))
        for key in active:
            share[key] += step * weights[key]
        left -= step * weight
        active = {key for key in active if demands[key] - share[key] > 1e-9}
    return share


_claims = st.dictionaries(
    st.text(alphabet="abcdefgh", min_size=1, max_size=3),
    st.tuples(
        st.sampled_from([0.0, 1.0, 2.0, 8.0]) | st.floats(0.0, 50.0),
        st.sampled_from([1.0, 2.0]) | st.floats(0.1, 10.0),
    ),
    max_size=12,
)


@given(capacity=st.floats(0.0, 200.0), claims=_claims)
def test_water_fill_is_max_min_fair_whatever_the_order_of_the_claimants(capacity, claims):
    demands = {key: demand for key, (demand, _) in claims.items()}
    weights = {key: weight for key, (_, weight) in claims.items()}
    shares = water_fill(capacity, demands, weights)
    expected = _progressive_filling(capacity, demands, weights)
    for key in demands:
        assert shares[key] <= demands[key] + 1e-9
        assert shares[key] == pytest.approx(expected[key], rel=1e-6, abs=1e-6)
    # Many claimants saturate at the same level (equal demands and weights): taken as
    # one group, whatever order the mapping lists them in, to the last bit.
    reversed_order = water_fill(
        capacity, dict(reversed(demands.items())), dict(reversed(weights.items()))
    )
    assert reversed_order == shares


def test_policy_config_rejects_inconsistent_settings():
    with pytest.raises(ValueError, match="floor"):
        PolicyConfig(
            tier_floors={"enterprise": 0.9, "paid": 0.0, "free": 0.0},
            tier_ceilings={"enterprise": 0.5, "paid": 1.0, "free": 1.0},
        )
    with pytest.raises(ValueError, match="missing"):
        PolicyConfig(tier_weights={"enterprise": 1.0})
    with pytest.raises(ValueError, match="half_life"):
        PolicyConfig(usage_half_life_s=0.0)
