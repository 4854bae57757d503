"""Admin forms: granting credit and setting budgets go through the services."""

import uuid

from django import forms

from apps.accounts.models import Org, Project, User
from apps.ledger.models import BucketKind, Budget


class GrantForm(forms.Form):
    kind = forms.ChoiceField(choices=BucketKind.choices)
    amount = forms.IntegerField(min_value=1, help_text="Micro-credits (1 credit = 1,000,000).")
    expires_at = forms.DateTimeField(required=False, help_text="Empty: never expires.")
    # Minted when the form is shown: submitting the same form twice grants once.
    idempotency_key = forms.CharField(widget=forms.HiddenInput, max_length=255)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["idempotency_key"].initial = f"admin-{uuid.uuid4()}"


class BucketGrantForm(GrantForm):
    """The bucket admin's add form: a new bucket is a grant."""

    org = forms.ModelChoiceField(queryset=Org.objects.all())
    project = forms.ModelChoiceField(
        queryset=Project.objects.select_related("org"),
        required=False,
        help_text="Only this project's jobs may use it. Empty: the whole org.",
    )
    field_order = ["org", "project", "kind", "amount", "expires_at"]

    def clean(self):
        data = super().clean()
        project, org = data.get("project"), data.get("org")
        if project is not None and org is not None and project.org_id != org.pk:
            self.add_error("project", "This project belongs to another org.")
        return data


class BudgetForm(forms.ModelForm):
    """Budgets are created and changed through set_budget, which recomputes the caches."""

    class Meta:
        model = Budget
        fields = ["org", "project", "user", "limit", "period", "mode"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["project"].queryset = Project.objects.select_related("org")
        self.fields["user"].queryset = User.objects.select_related("org")
