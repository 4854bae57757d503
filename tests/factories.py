"""factory-boy factories shared by the test suite."""

import factory

from apps.accounts.models import Org, Project, Tier, User
from apps.accounts.services import issue_api_key


class OrgFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Org

    name = factory.Sequence(lambda n: f"org-{n}")
    tier = Tier.PAID
    weight = 1.0


class ProjectFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Project

    org = factory.SubFactory(OrgFactory)
    name = factory.Sequence(lambda n: f"project-{n}")


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = User

    org = factory.SubFactory(OrgFactory)
    name = factory.Sequence(lambda n: f"user-{n}")


def org_key(org, *, project=None, user=None) -> str:
    """A raw API key for the org (optionally narrowed)."""
    return issue_api_key(org=org, project=project, user=user).raw_key


def operator_key() -> str:
    return issue_api_key(operator=True, name="test-operator").raw_key
