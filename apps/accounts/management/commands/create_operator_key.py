import getpass

from django.core.management.base import BaseCommand

from apps.accounts import operations


class Command(BaseCommand):
    help = "Create an operator API key and print it on the last line (shown once)."

    def add_arguments(self, parser):
        parser.add_argument("--name", default="operator")

    def handle(self, *args, name, **options):
        # Recorded like any operator's key (apikey.create), by the shell user who ran it.
        issued = operations.issue_api_key(actor=f"cli:{_shell_user()}", operator=True, name=name)
        self.stdout.write(f"Created operator key {issued.api_key.prefix}… ({name})")
        self.stdout.write(issued.raw_key)


def _shell_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name in some containers
        return "unknown"
