# The idempotency record now belongs to the core app (core.0001); the table is kept.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("accounts", "0002_operator_action"), ("core", "0001_idempotentrequest")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="IdempotentRequest")],
            database_operations=[],
        ),
    ]
