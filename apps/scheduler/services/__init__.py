"""Scheduler services. The fleet's are re-exported here (management commands, admin);
dispatch, snapshot, preemption, usage and recovery live in their own modules."""

from apps.scheduler.services.fleet import (
    add_node,
    drain_node,
    load_fleet,
    remove_node,
    undrain_node,
)

__all__ = ["add_node", "drain_node", "load_fleet", "remove_node", "undrain_node"]
