"""The policy's knobs as operators set them: GANTRY_POLICY, checked at start-up."""

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from apps.scheduler.checks import configured_policy
from apps.scheduler.policy import PolicyConfig, policy_with


def test_a_per_tier_knob_may_name_only_the_tiers_it_changes():
    defaults = PolicyConfig()
    config = policy_with({"tier_floors": {"free": 0.1}, "scan_budget": 100})
    assert config.tier_floors == {**defaults.tier_floors, "free": 0.1}
    assert config.scan_budget == 100
    assert config.tier_weights == defaults.tier_weights


def test_a_tiers_floor_in_gpus_keeps_its_fraction_and_the_guaranteed_gpus_round_down():
    config = policy_with({"tier_floors": {"enterprise": 0.2, "paid": 0.1, "free": 0.05}})
    # Free's 5 % of 16 GPUs is 0.8 GPU: it is served first below that, but preemption
    # guarantees it no whole GPU.
    assert config.floor_gpus(16) == pytest.approx({"enterprise": 3.2, "paid": 1.6, "free": 0.8})
    assert config.guaranteed_gpus(16) == {"enterprise": 3, "paid": 1, "free": 0}
    assert config.guaranteed_gpus(20) == {"enterprise": 4, "paid": 2, "free": 1}


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"max_reservations": 8}, "max_reservations"),
        ({"tier_floors": {"gold": 0.1}}, "gold"),
        ({"tier_floors": 0.1}, "tier_floors"),
        ({"tier_weights": {"free": "heavy"}}, "tier_weights"),
        ({"tier_floors": {"free": 0.9}}, "floor <= ceiling"),
        ({"preemption_hold_back_limit_s": {"paid": -5}}, "preemption_hold_back_limit_s.paid"),
        ({"within_tier_fifo_backlog_s": {"paid": -1}}, "within_tier_fifo_backlog_s.paid"),
        ({"within_tier_fifo_backlog_s": {"paid": None}}, "within_tier_fifo_backlog_s.paid"),
        # JSON's NaN and Infinity, which Python reads, and a bool for a number
        ({"reservation_wait_s": float("nan")}, "reservation_wait_s: must be a finite"),
        ({"reclaim_wait_s": float("inf")}, "reclaim_wait_s: must be a finite"),
        ({"tier_weights": {"paid": float("inf")}}, "tier_weights.paid: must be a finite"),
        ({"scan_budget": True}, "scan_budget: must be a number"),
        ({"within_tier_fifo": 1}, "within_tier_fifo: must be true or false"),
        (
            {"drains_within_floor_while_higher_tiers_wait": {"free": 1}},
            "drains_within_floor_while_higher_tiers_wait: each tier's value must be true",
        ),
    ],
)
def test_a_wrong_knob_is_refused_by_name(overrides, named):
    with pytest.raises(ValueError, match=named):
        policy_with(overrides)


def test_the_dispatcher_reads_gantry_policy_over_the_defaults(settings):
    settings.GANTRY_POLICY = {"preemption_wait_s": {"paid": 30.0}}
    settings.GANTRY_USAGE_HALF_LIFE_S = 900
    config = configured_policy()
    assert config.preemption_wait_s == {**PolicyConfig().preemption_wait_s, "paid": 30.0}
    assert config.usage_half_life_s == 900.0


def test_a_wrong_gantry_policy_stops_the_start_up_checks_with_the_knobs_name(settings):
    settings.GANTRY_POLICY = {"max_reservations": 8}
    with pytest.raises(SystemCheckError, match=r"gantry\.E001.*max_reservations"):
        call_command("check")
    settings.GANTRY_POLICY = {"tier_floors": {"free": 0.1}}
    call_command("check")
