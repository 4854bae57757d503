"""The scheduling policy's settings, read once and checked at start-up.

`configured_policy()` is the one reading of `GANTRY_POLICY` (with the usage half-life);
`check_policy_settings` is a Django system check, so a knob that does not exist or a
value out of range stops `manage.py migrate` (and so `make up`) with the knob's name,
instead of failing every dispatch tick.
"""

from __future__ import annotations

from django.conf import settings
from django.core import checks

from apps.scheduler.policy import PolicyConfig, policy_with


def configured_policy() -> PolicyConfig:
    """The policy's knobs from settings: the defaults, `GANTRY_USAGE_HALF_LIFE_S` and any
    `GANTRY_POLICY` overrides (a per-tier knob may name only some tiers). Raises
    ValueError naming the knob that is wrong."""
    options = dict(settings.GANTRY_POLICY or {})
    options.setdefault("usage_half_life_s", float(settings.GANTRY_USAGE_HALF_LIFE_S))
    return policy_with(options)


def check_policy_settings(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    try:
        configured_policy()
    except ValueError as exc:
        return [
            checks.Error(
                f"GANTRY_POLICY: {exc}",
                hint="See the knobs and their ranges in docs/simulator.md (Default policy "
                "parameters); a per-tier knob may name only the tiers it changes.",
                id="gantry.E001",
            )
        ]
    return []
