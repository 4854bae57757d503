"""Property-based: random sequences of ledger operations keep every invariant.

After every step the reconciler (which replays the entries against every cache,
allocation, hold and budget) must find nothing, and the model below must agree with
what the services answered.
"""

import itertools
from datetime import timedelta

import pytest
from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now
from django.test import override_settings
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from apps.core.clock import db_now
from apps.core.errors import BudgetExceeded, Conflict, InsufficientCredits
from apps.ledger import selectors, services
from apps.ledger.models import Bucket, Hold, HoldState
from tests.factories import OrgFactory, ProjectFactory

pytestmark = pytest.mark.django_db

amounts = st.integers(min_value=1, max_value=50_000)


class LedgerMachine(RuleBasedStateMachine):
    buckets = Bundle("buckets")
    holds = Bundle("holds")

    def __init__(self):
        super().__init__()
        # Each example runs in a savepoint rolled back at teardown, so the reconciler
        # (which checks the whole database) sees only this example's history.
        self.example = transaction.atomic()
        self.example.__enter__()
        self.org = OrgFactory()
        self.project = ProjectFactory(org=self.org)
        self.keys = itertools.count()
        self.marks: dict = {}  # (hold id, attempt) -> (cumulative, seq) last sent
        self.usage: dict = {}  # hold id -> usage the ledger must have recorded
        self.closed: dict = {}  # hold id -> the first SettleResult
        self.budgets = 0

    @initialize(target=buckets, amount=st.integers(100_000, 1_000_000))
    def opening_credit(self, amount):
        return services.grant(org=self.org, kind="paid", amount=amount)

    def _scope(self, scoped):
        return self.project if scoped else None

    @rule(
        target=buckets,
        kind=st.sampled_from(["paid", "promo", "grant"]),
        amount=st.integers(1, 200_000),
        scoped=st.booleans(),
        expiring=st.booleans(),
    )
    def issue(self, kind, amount, scoped, expiring):
        expires_at = db_now() + timedelta(days=1) if expiring else None
        return services.grant(
            org=self.org,
            project=self._scope(scoped),
            kind=kind,
            amount=amount,
            expires_at=expires_at,
        )

    @rule(target=holds, amount=amounts, scoped=st.booleans())
    def reserve(self, amount, scoped):
        key = f"k{next(self.keys)}"
        try:
            hold = services.reserve(
                org=self.org, project=self._scope(scoped), amount=amount, idempotency_key=key
            )
        except (InsufficientCredits, BudgetExceeded):
            assert not Hold.objects.filter(org=self.org, idempotency_key=key).exists()
            return multiple()
        again = services.reserve(
            org=self.org, project=self._scope(scoped), amount=amount, idempotency_key=key
        )
        assert again.pk == hold.pk
        # Invariant 7: a hold was admitted only within every hard budget above it.
        for budget in selectors.with_budget_usage(selectors.budgets_of(org=self.org)):
            held, consumed = selectors.budget_usage(budget)
            # The admin's list reads the same figures with its rows.
            assert (budget.usage_held, budget.usage_consumed) == (held, consumed)
            if budget.mode == "hard" and budget.project_id in (None, hold.project_id):
                assert held + consumed <= budget.limit
        self.usage[hold.pk] = 0
        return hold

    @rule(
        hold=holds,
        attempt=st.sampled_from(["a", "b"]),
        step=st.integers(0, 30_000),
        replay=st.booleans(),
    )
    def meter(self, hold, attempt, step, replay):
        cumulative, seq = self.marks.get((hold.pk, attempt), (0, 0))
        if replay and seq:
            result = services.meter(hold, cumulative_usage=cumulative, seq=seq, attempt_key=attempt)
            assert not result.applied
            return
        new = (cumulative + step, seq + 1)
        result = services.meter(hold, cumulative_usage=new[0], seq=new[1], attempt_key=attempt)
        if hold.pk in self.closed:
            assert not result.applied
            return
        self.marks[(hold.pk, attempt)] = new
        self.usage[hold.pk] += step
        assert result.usage == self.usage[hold.pk]
        assert result.captured <= min(result.usage, result.amount)

    @rule(hold=holds, attempt=st.sampled_from(["a", "b"]), step=st.integers(0, 30_000))
    def heartbeat_batched(self, hold, attempt, step):
        cumulative, seq = self.marks.get((hold.pk, attempt), (0, 0))
        new = (cumulative + step, seq + 1)
        services.record_usage(
            hold_id=hold.pk, attempt_key=attempt, cumulative_usage=new[0], seq=new[1]
        )
        services.fold_usage_reports()
        if hold.pk not in self.closed:
            self.marks[(hold.pk, attempt)] = new
            self.usage[hold.pk] += step

    @rule(hold=holds, amount=amounts)
    def extend(self, hold, amount):
        try:
            services.extend(hold, amount=amount)
        except (InsufficientCredits, BudgetExceeded):
            pass
        except Conflict:
            assert hold.pk in self.closed

    @rule(hold=holds, extra=st.integers(0, 20_000), release=st.booleans())
    def settle(self, hold, extra, release):
        if release:
            services.release(hold, reason="never ran")
            result = services.settle(hold, reason="again")
            assert result.replayed or hold.pk in self.closed
        else:
            cumulative, _seq = self.marks.get((hold.pk, "a"), (0, 0))
            result = services.settle(
                hold, reason="done", final_usage=cumulative + extra, attempt_key="a"
            )
        if hold.pk in self.closed:
            first = self.closed[hold.pk]
            assert result.replayed
            assert (result.captured, result.refunded) == (first.captured, first.refunded)
            return
        if not release:
            self.marks[(hold.pk, "a")] = (
                cumulative + extra,
                self.marks.get((hold.pk, "a"), (0, 0))[1],
            )
            self.usage[hold.pk] += extra
        self.closed[hold.pk] = services.settle(hold, reason="replay")
        assert result.captured + result.refunded == result.amount
        assert result.usage == self.usage[hold.pk]

    @rule(bucket=consumes(buckets))
    def expire(self, bucket):
        """Time passes: the bucket's (every lane's) expiry is now (database clock)."""
        lanes = Bucket.objects.filter(Q(pk=bucket.pk) | Q(lane_of=bucket.pk))
        lanes.update(expires_at=Now())
        services.expire_buckets()
        assert all(lane.remaining == 0 for lane in lanes)

    @rule(hold=holds)
    def stale(self, hold):
        """The finish call never comes: recovery settles at the metered usage, once."""
        Hold.objects.filter(pk=hold.pk).update(expires_at=Now())
        closed_now = services.expire_stale_holds()
        assert services.expire_stale_holds() == 0
        if hold.pk in self.closed:
            assert closed_now == 0
        else:
            assert closed_now == 1
            self.closed[hold.pk] = services.settle(hold, reason="replay")
            assert self.closed[hold.pk].state == HoldState.EXPIRED

    @precondition(lambda self: self.budgets < 2)  # or budget changes crowd out the rest
    @rule(
        limit=st.integers(0, 1_000_000),
        mode=st.sampled_from(["hard", "soft"]),
        scoped=st.booleans(),
    )
    def budget(self, limit, mode, scoped):
        self.budgets += 1
        services.set_budget(
            org=self.org, project=self._scope(scoped), limit=limit, period="month", mode=mode
        )

    def teardown(self):
        transaction.set_rollback(True)
        self.example.__exit__(None, None, None)
        services.fold_usage_reports()  # nothing may be left for the next example

    @invariant()
    def reconciled(self):
        violations = services.reconcile(record=False)
        assert violations == [], "\n".join(map(str, violations))

    @invariant()
    def buckets_never_overdrawn(self):
        for bucket in Bucket.objects.filter(org=self.org):
            assert 0 <= bucket.consumed + bucket.held + bucket.expired <= bucket.granted


HISTORIES = settings(
    max_examples=25,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def test_random_ledger_histories_keep_every_invariant(usage_redis):
    run_state_machine_as_test(LedgerMachine, settings=HISTORIES)


def test_random_histories_on_grants_and_budgets_in_lanes_keep_every_invariant(usage_redis):
    """The same, with grants and budget limits of 40,000 µc and more in up to four lanes."""
    with override_settings(GANTRY_LEDGER_BUCKET_LANES=4, GANTRY_LEDGER_LANE_MIN=20_000):
        run_state_machine_as_test(LedgerMachine, settings=HISTORIES)
