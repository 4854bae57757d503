"""Fleets for the simulator: a synthetic H100/A100 fleet, or a GANTRY_FLEET_FILE."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from apps.fleet.fleet_file import read_fleet_file  # the one parser of the fleet format (no DB)
from apps.scheduler.policy import GpuType

H100 = GpuType("H100", memory_gb=80, price_per_gpu_hour=4_000_000)
A100 = GpuType("A100", memory_gb=40, price_per_gpu_hour=2_500_000)


@dataclass(frozen=True, slots=True)
class FleetModel:
    gpu_types: tuple[GpuType, ...]
    nodes: tuple[tuple[str, tuple[str, ...]], ...]  # (node name, GPU type of each device)

    @property
    def total_gpus(self) -> int:
        return sum(len(gpus) for _, gpus in self.nodes)

    def scaled_to(self, gpus: int, *, holding: Iterable[Need] = ()) -> FleetModel:
        """About `gpus` GPUs with the same mix: this fleet's nodes in an order that keeps
        each kind of node at its share of every prefix (`_mixed`; copies named
        `<node>~<n>` once they run out), the last one cut to size; then, while a need
        of `holding` (a job's allowed GPU models, empty for any, and its GPU count) that
        some node of this fleet meets is met by none taken, the next node that meets it,
        cut to the widest need it meets. Taken in the fleet's own order, a synthetic
        fleet (its H100 nodes first) cut to 32 GPUs had no A100, and a trace's A100 jobs
        waited for ever."""
        if gpus < 1:
            raise ValueError("a fleet needs at least one GPU")
        mixed = _mixed(self.nodes)
        unmet = {need for need in holding if any(_meets(kinds, need) for _, kinds in mixed)}
        nodes, total, copy = [], 0, 0
        while total < gpus or unmet:
            for name, kinds in mixed:
                served = [need for need in unmet if _meets(kinds, need)]
                if total >= gpus and not served:
                    continue
                # Cut to what the target still asks for, or to the widest need it serves.
                cut = kinds[: max(gpus - total, *(count for _, count in served), 0)]
                if cut and all(_meets(cut, need) for need in served):
                    kinds = cut
                nodes.append((name if copy == 0 else f"{name}~{copy}", kinds))
                total += len(kinds)
                unmet = {need for need in unmet if not _meets(kinds, need)}
                if total >= gpus and not unmet:
                    break
            copy += 1
        return FleetModel(gpu_types=self.gpu_types, nodes=tuple(nodes))

    def describe(self) -> str:
        by_type: dict[str, int] = {}
        for _, gpus in self.nodes:
            for gpu_type in gpus:
                by_type[gpu_type] = by_type.get(gpu_type, 0) + 1
        mix = ", ".join(f"{count} {name}" for name, count in sorted(by_type.items()))
        return f"{len(self.nodes)} nodes, {self.total_gpus} GPUs ({mix})"


# A job's need of one node: its allowed GPU models (empty: any) and its GPU count.
Need = tuple[tuple[str, ...], int]


def _meets(kinds: tuple[str, ...], need: Need) -> bool:
    """Whether a node of these GPUs holds the job: its GPUs all of one allowed model, as
    the policy places them (one pool of a node)."""
    types, count = need
    return any(kinds.count(kind) >= count for kind in set(kinds) if not types or kind in types)


def _mixed(nodes: tuple[tuple[str, tuple[str, ...]], ...]) -> list:
    """`nodes` reordered so that every prefix holds each kind of node (its GPU models)
    in proportion to the whole (the kind furthest behind its share goes next; ties in
    order of first appearance), each kind's nodes in their own order."""
    kinds: dict[tuple[str, ...], list] = {}
    for node in nodes:
        kinds.setdefault(tuple(sorted(set(node[1]))), []).append(node)
    groups = list(kinds.values())
    taken = [0] * len(groups)
    order = []
    for _ in range(len(nodes)):
        behind = min(
            (i for i in range(len(groups)) if taken[i] < len(groups[i])),
            key=lambda i: (taken[i] + 0.5) / len(groups[i]),
        )
        order.append(groups[behind][taken[behind]])
        taken[behind] += 1
    return order


def synthetic_fleet(total_gpus: int, h100_share: float = 0.4, gpus_per_node: int = 8) -> FleetModel:
    """Nodes of `gpus_per_node` GPUs, about `h100_share` of them H100 (80 GB) and at least
    the first, the rest A100 (40 GB). The last node is smaller if `total_gpus` is not a
    multiple. Its GPU types are those its nodes have (`_fleet_of_its_nodes_types`)."""
    if total_gpus < 1:
        raise ValueError("a fleet needs at least one GPU")
    node_count = -(-total_gpus // gpus_per_node)
    # One node is an H100, as the one-GPU pool; 2+ nodes keep about the share.
    h100_nodes = max(1, round(node_count * h100_share))
    nodes = []
    remaining = total_gpus
    for i in range(node_count):
        size = min(gpus_per_node, remaining)
        remaining -= size
        kind = "H100" if i < h100_nodes else "A100"
        nodes.append((f"{kind.lower()}-{i:04d}", (kind,) * size))
    return _fleet_of_its_nodes_types((H100, A100), tuple(nodes))


def fleet_of_types(total_gpus: int, names: list[str], gpus_per_node: int = 8) -> FleetModel:
    """A fleet for a trace that comes without one: nodes of `gpus_per_node` GPUs, the
    GPU models it names in turn (equal shares), memory and price unknown (80 GB, the
    H100's price), so that no row is dropped for a model the fleet lacks."""
    if total_gpus < 1 or not names:
        raise ValueError("a fleet needs at least one GPU and one GPU type")
    gpu_types = tuple(
        GpuType(name, memory_gb=80, price_per_gpu_hour=H100.price_per_gpu_hour) for name in names
    )
    per_node = max(1, min(gpus_per_node, total_gpus // len(names)))  # every model a node
    nodes, remaining, i = [], total_gpus, 0
    while remaining > 0:
        size = min(per_node, remaining)
        kind = names[i % len(names)]
        nodes.append((f"{kind.lower()}-{i:04d}", (kind,) * size))
        remaining -= size
        i += 1
    return FleetModel(gpu_types=gpu_types, nodes=tuple(nodes))


def fleet_from_file(path: str | Path) -> FleetModel:
    spec = read_fleet_file(path)
    nodes = tuple((name, tuple(kind for kind, _ in gpus)) for name, gpus in spec.nodes)
    gpu_types = tuple(
        GpuType(name, memory_gb=memory, price_per_gpu_hour=price)
        for name, (memory, price) in spec.gpu_types.items()
    )
    return _fleet_of_its_nodes_types(gpu_types, nodes)


def _fleet_of_its_nodes_types(gpu_types, nodes) -> FleetModel:
    """The fleet of `nodes` with only those of `gpu_types` its nodes have: a workload is
    drawn for the fleet's types, and one drawn for a type no node has (an 80 GB job on a
    node of A100s) would only wait for ever."""
    present = {kind for _, kinds in nodes for kind in kinds}
    return FleetModel(gpu_types=tuple(t for t in gpu_types if t.name in present), nodes=nodes)
