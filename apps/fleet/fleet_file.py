"""The fleet file format (docs/api.md) and the built-in demo fleet; parsing only, no DB."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# A laptop-sized fleet of fake devices so the whole stack runs without a GPU.
DEMO_FLEET = {
    "gpu_types": {
        "H100": {"memory_gb": 80, "price_per_gpu_hour": 4_000_000},
        "A100": {"memory_gb": 40, "price_per_gpu_hour": 2_500_000},
    },
    "nodes": [
        {"name": "h100-1", "gpus": [{"type": "H100"}] * 4},
        {"name": "a100-1", "gpus": [{"type": "A100"}] * 4},
        {"name": "a100-2", "gpus": [{"type": "A100"}] * 2},
    ],
}


class FleetFileError(ValueError):
    pass


@dataclass(frozen=True)
class FleetSpec:
    gpu_types: dict[str, tuple[int, int]]  # name -> (memory_gb, price_per_gpu_hour)
    nodes: list[tuple[str, list[tuple[str, str]]]]  # (name, [(type, device id)])


def parse_fleet(document: dict) -> FleetSpec:
    """Validate a fleet document; errors name the offending path."""
    if not isinstance(document, dict):
        raise FleetFileError("fleet: expected a JSON object")
    raw_types = document.get("gpu_types")
    if not isinstance(raw_types, dict) or not raw_types:
        raise FleetFileError("gpu_types: expected a non-empty object")
    gpu_types = {}
    for name, spec in raw_types.items():
        memory, price = (spec or {}).get("memory_gb"), (spec or {}).get("price_per_gpu_hour")
        if not isinstance(memory, int) or memory <= 0:
            raise FleetFileError(f"gpu_types.{name}.memory_gb: expected a positive integer")
        if not isinstance(price, int) or price < 0:
            raise FleetFileError(f"gpu_types.{name}.price_per_gpu_hour: expected an integer ≥ 0")
        gpu_types[name] = (memory, price)
    raw_nodes = document.get("nodes")
    if not isinstance(raw_nodes, list):
        raise FleetFileError("nodes: expected a list")
    nodes, seen = [], set()
    for i, node in enumerate(raw_nodes):
        name = (node or {}).get("name")
        if not isinstance(name, str) or not name or name in seen:
            raise FleetFileError(f"nodes[{i}].name: expected a unique non-empty string")
        seen.add(name)
        gpus = []
        for j, gpu in enumerate(node.get("gpus") or []):
            kind = (gpu or {}).get("type")
            if kind not in gpu_types:
                raise FleetFileError(f"nodes[{i}].gpus[{j}].type: unknown GPU type {kind!r}")
            gpus.append((kind, str(gpu.get("device", ""))))
        if not gpus:
            raise FleetFileError(f"nodes[{i}].gpus: a node needs at least one GPU")
        nodes.append((name, gpus))
    return FleetSpec(gpu_types=gpu_types, nodes=nodes)


def read_fleet_file(path: str | Path | None) -> FleetSpec:
    if not path:
        return parse_fleet(DEMO_FLEET)
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise FleetFileError(f"{path}: {exc}") from exc
    return parse_fleet(document)
