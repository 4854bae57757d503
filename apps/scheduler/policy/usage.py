"""Decayed GPU-second usage: what fair share compares.

A usage value halves every `half_life_s` seconds and grows by the GPU-seconds consumed.
Stored as (value, as_of) it can be brought to any later time with `decay`, and updated
with `accrue`; both are exact and order-independent (accruing a+b at once equals
accruing a then b at the same instant).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

from .config import PolicyConfig
from .snapshot import UsageSnapshot


def decay(value: float, elapsed_s: float, half_life_s: float) -> float:
    """`value` as it reads `elapsed_s` later (it halves every `half_life_s`)."""
    if elapsed_s <= 0:
        return value
    return value * math.exp2(-elapsed_s / half_life_s)


def accrue(value: float, as_of: float, now: float, gpu_seconds: float, half_life_s: float) -> float:
    """Usage `value` recorded at `as_of`, decayed to `now`, plus `gpu_seconds` used at `now`.

    The dispatcher stores the result with `as_of = now`."""
    return decay(value, now - as_of, half_life_s) + gpu_seconds


def equivalent_gpus(decayed_gpu_seconds: float, half_life_s: float) -> float:
    """The steady number of GPUs whose decayed usage settles at this value.

    Holding g GPUs forever yields g * half_life / ln 2 decayed GPU-seconds, so this is the
    inverse: it lets the policy blend past usage with GPUs held right now."""
    return decayed_gpu_seconds * math.log(2) / half_life_s


class _DecayedView(Mapping):
    """Read-only mapping of a `DecayedUsage` level, scaled to one instant."""

    __slots__ = ("_factor", "_values")

    def __init__(self, values: dict, factor: float):
        self._values = values
        self._factor = factor

    def __getitem__(self, key):
        return self._values[key] * self._factor

    def get(self, key, default=0.0):
        value = self._values.get(key)
        return default if value is None else value * self._factor

    def __iter__(self) -> Iterator:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


class DecayedUsage:
    """In-memory decayed usage per tier, org and (org, user): the simulator's ledger.

    Values are kept scaled to a reference time so that adding is O(1) and reading all of
    them at `now` is one multiplication each; the reference moves forward before the
    scale factor could overflow.
    """

    _REBASE_AFTER_HALF_LIVES = 256.0

    def __init__(self, half_life_s: float | None = None):
        self.half_life_s = half_life_s or PolicyConfig().usage_half_life_s
        self._reference = 0.0
        self._by_tier: dict[str, float] = {}
        self._by_org: dict[str, float] = {}
        self._by_user: dict[tuple[str, str], float] = {}

    def _scale(self, now: float) -> float:
        return math.exp2((now - self._reference) / self.half_life_s)

    def add(self, now: float, tier: str, org: str, user: str, gpu_seconds: float) -> None:
        """Record `gpu_seconds` used at `now` by `user` of `org` in `tier`."""
        if (now - self._reference) / self.half_life_s > self._REBASE_AFTER_HALF_LIVES:
            self._rebase(now)
        amount = gpu_seconds * self._scale(now)
        self._by_tier[tier] = self._by_tier.get(tier, 0.0) + amount
        self._by_org[org] = self._by_org.get(org, 0.0) + amount
        key = (org, user)
        self._by_user[key] = self._by_user.get(key, 0.0) + amount

    def _rebase(self, now: float) -> None:
        factor = math.exp2(-(now - self._reference) / self.half_life_s)
        for level in (self._by_tier, self._by_org, self._by_user):
            for key in level:
                level[key] *= factor
        self._reference = now

    def snapshot(self, now: float) -> UsageSnapshot:
        """Usage as of `now` (reads are lazy: O(1) to take, O(1) per key read)."""
        factor = math.exp2(-(now - self._reference) / self.half_life_s)
        return UsageSnapshot(
            by_tier=_DecayedView(self._by_tier, factor),
            by_org=_DecayedView(self._by_org, factor),
            by_user=_DecayedView(self._by_user, factor),
        )
