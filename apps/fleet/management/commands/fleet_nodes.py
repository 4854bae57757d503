from django.core.management.base import BaseCommand
from django.db.models import Count

from apps.fleet.models import Node, NodeState


class Command(BaseCommand):
    help = "Print '<node> <gpu count>' for each node that needs a worker pool."

    def handle(self, *args, **options):
        nodes = Node.objects.exclude(state=NodeState.DOWN).annotate(gpu_count=Count("gpus"))
        for node in nodes.order_by("name"):
            self.stdout.write(f"{node.name} {node.gpu_count}")
