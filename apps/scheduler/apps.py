from django.apps import AppConfig
from django.core import checks

from apps.scheduler.checks import check_policy_settings


class SchedulerConfig(AppConfig):
    name = "apps.scheduler"
    label = "scheduler"
    verbose_name = "Scheduler and fleet"

    def ready(self) -> None:
        checks.register(check_policy_settings)
