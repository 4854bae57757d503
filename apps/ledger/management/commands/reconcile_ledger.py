from django.core.management.base import BaseCommand, CommandError

from apps.ledger.services import reconcile
from apps.ledger.services.reconcile import CHECKS


class Command(BaseCommand):
    help = (
        "Check every ledger invariant against the entries; print the violations, record "
        "them as audit events and exit 1 if there are any."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--no-record", action="store_true", help="Only print; record no audit events."
        )

    def handle(self, *args, **options):
        violations = reconcile(record=not options["no_record"])
        for violation in violations:
            self.stdout.write(f"{violation.check}\t{violation.subject}\t{violation.detail}")
        if violations:
            raise CommandError(f"{len(violations)} ledger invariant violation(s).")
        self.stdout.write(f"ledger reconciled: {len(CHECKS)} checks, no violations")
