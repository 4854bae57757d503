from django.core.management.base import BaseCommand

from apps.accounts.services import issue_api_key


class Command(BaseCommand):
    help = "Create an operator API key and print it on the last line (shown once)."

    def add_arguments(self, parser):
        parser.add_argument("--name", default="operator")

    def handle(self, *args, name, **options):
        issued = issue_api_key(operator=True, name=name)
        self.stdout.write(f"Created operator key {issued.api_key.prefix}… ({name})")
        self.stdout.write(issued.raw_key)
