"""Discrete-event simulator of the scheduling policy (pure Python, no Django, no DB).

    python -m apps.scheduler.simulate --scenario steady --gpus 1000 --policy all --out out/

See `engine.py` for the model, `workload.py` for the scenarios, `metrics.py` for the
definitions of the reported figures, and docs/simulator.md for results.
"""

from .engine import JobRecord, SimResult, Simulation, SimulationError
from .fleet import FleetModel, fleet_from_file, synthetic_fleet
from .metrics import Summary, format_table, jain_index, summarize
from .runner import POLICIES, SCENARIOS, ScenarioReport, run_scenario

__all__ = [
    "POLICIES",
    "SCENARIOS",
    "FleetModel",
    "JobRecord",
    "ScenarioReport",
    "SimResult",
    "Simulation",
    "SimulationError",
    "Summary",
    "fleet_from_file",
    "format_table",
    "jain_index",
    "run_scenario",
    "summarize",
    "synthetic_fleet",
]
