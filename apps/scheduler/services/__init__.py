"""Scheduler services: dispatch, snapshot, preemption, usage and recovery, each in its own
module. The fleet's inventory services are apps.fleet.services."""
