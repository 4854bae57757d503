from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from apps.fleet.fleet_file import FleetFileError, read_fleet_file
from apps.fleet.services import load_fleet


class Command(BaseCommand):
    help = "Load GANTRY_FLEET_FILE (or the built-in demo fleet) into the database."

    def add_arguments(self, parser):
        parser.add_argument("--file", default=None, help="Fleet JSON (default: GANTRY_FLEET_FILE)")

    def handle(self, *args, file=None, **options):
        path = file or settings.GANTRY_FLEET_FILE
        try:
            spec = read_fleet_file(path)
        except FleetFileError as exc:
            raise CommandError(str(exc)) from exc
        nodes = load_fleet(spec)
        gpus = sum(len(g) for _, g in spec.nodes)
        self.stdout.write(f"fleet: {len(nodes)} nodes, {gpus} GPUs ({path or 'demo fleet'})")
