# The idempotency record moved from the accounts app to core; its table stays where it is
# (state-only: accounts.0003 drops it from the accounts app's state, nothing in the DB).

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [("accounts", "0002_operator_action")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="IdempotentRequest",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("scope", models.CharField(max_length=64)),
                        ("key", models.CharField(max_length=255)),
                        ("method", models.CharField(max_length=8)),
                        ("path", models.CharField(max_length=255)),
                        ("body_digest", models.CharField(max_length=64)),
                        ("status_code", models.PositiveSmallIntegerField()),
                        ("response_body", models.JSONField()),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                    ],
                    options={
                        "db_table": "accounts_idempotentrequest",
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("scope", "key"), name="idempotency_key_per_scope"
                            )
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
