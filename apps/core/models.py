"""What every app stands on and keeps in the database: the idempotency record."""

from django.db import models


class IdempotentRequest(models.Model):
    """The first answer to a mutating request, replayed for the same Idempotency-Key.

    Scoped by the caller's org (or the operator), so two tenants never share keys.
    """

    scope = models.CharField(max_length=80)
    key = models.CharField(max_length=255)
    method = models.CharField(max_length=8)
    path = models.CharField(max_length=255)
    body_digest = models.CharField(max_length=64)
    status_code = models.PositiveSmallIntegerField()
    response_body = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "accounts_idempotentrequest"  # created by the accounts app; kept
        constraints = [
            models.UniqueConstraint(fields=["scope", "key"], name="idempotency_key_per_scope")
        ]

    def __str__(self):
        return f"{self.scope}:{self.key}"
