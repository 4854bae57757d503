"""factory-boy factories for ledger objects. They go through the services, so every
bucket, hold and budget they make is backed by its entries like a real one."""

import factory

from apps.ledger import services
from apps.ledger.models import Bucket, BucketKind, Budget, BudgetMode, BudgetPeriod, Hold
from tests.factories import OrgFactory

CREDIT = 1_000_000  # micro-credits


class BucketFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Bucket

    org = factory.SubFactory(OrgFactory)
    project = None
    kind = BucketKind.PAID
    granted = 100 * CREDIT
    expires_at = None
    idempotency_key = None

    @classmethod
    def _create(cls, model_class, *, org, project, kind, granted, expires_at, idempotency_key):
        return services.grant(
            org=org,
            project=project,
            kind=kind,
            amount=granted,
            expires_at=expires_at,
            idempotency_key=idempotency_key,
            actor="factory",
        )


class HoldFactory(factory.django.DjangoModelFactory):
    """A reservation; the org needs the credit (e.g. a BucketFactory first)."""

    class Meta:
        model = Hold

    org = factory.SubFactory(OrgFactory)
    project = None
    user = None
    amount = 10 * CREDIT
    idempotency_key = factory.Sequence(lambda n: f"hold-{n}")
    expires_at = None

    @classmethod
    def _create(cls, model_class, *, org, project, user, amount, idempotency_key, expires_at):
        return services.reserve(
            org=org,
            project=project,
            user=user,
            amount=amount,
            idempotency_key=idempotency_key,
            expires_at=expires_at,
        )


class BudgetFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Budget

    org = factory.SubFactory(OrgFactory)
    project = None
    user = None
    limit = 50 * CREDIT
    period = BudgetPeriod.MONTH
    mode = BudgetMode.HARD

    @classmethod
    def _create(cls, model_class, *, org, project, user, limit, period, mode):
        return services.set_budget(
            org=org, project=project, user=user, limit=limit, period=period, mode=mode
        )
