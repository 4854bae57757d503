"""Free-capacity index, gang best-fit placement, reservations and backfill.

The unit of placement is a *pool*: the GPUs of one type on one active node. A job's GPUs
all come from one pool (gang placement: never split across nodes or types).

Free capacity is indexed by (GPU type, free count), so finding the best-fit pool for a
job — the pool of its most preferred allowed type with the fewest free GPUs that still
hold it, which keeps large holes for multi-GPU jobs — costs O(max GPUs per node · log N)
instead of a scan of all N nodes.

A *reservation* promises a blocked job the GPUs of one pool at a future `start` (the
time enough of them will be free, from running allocations' expected ends). Other jobs
may still use that pool only if they are done by `start`, or if the pool has more GPUs
available by `start` than the reservation needs (its *surplus*): that is backfill, and
it can never delay the reserved job.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .config import TIER_RANK
from .snapshot import GpuType, Id, Node, NodeState, QueuedJob, RunningAllocation

_NEVER = math.inf
TIME_FIT_CANDIDATES = 4  # admissible pools compared on end times per placement
BUCKET_VISITS = 64  # pools looked at per (type, free count) before trying the next count


@dataclass(slots=True)
class Reservation:
    """GPUs of one pool promised to `job_id` from `start` on."""

    job_id: Id
    start: float
    count: int
    surplus: int  # GPUs available by `start` beyond `count`: usable by jobs ending later
    claim: bool = False  # made by a preemption: the GPUs are being freed for this job
    pool_ordinal: int = -1
    rank: int = 0  # the tier rank of the job it holds for (TIER_RANK)
    # A drain whose node the jobs of higher tiers use as any other (never a claim's).
    open_to_higher_tiers: bool = False

    def admits(self, count: int, end: float) -> bool:
        """Whether a job of `count` GPUs ending at `end` can use this pool without delaying
        the reserved job."""
        return end <= self.start or count <= self.surplus


class Pool:
    """The GPUs of one type on one active node, with what the policy knows about them."""

    __slots__ = (
        "_ends_sorted",
        "allocations",
        "ends",
        "free_ids",
        "gpu_type",
        "latest_end",
        "node",
        "ordinal",
        "preemption_locked",
        "reservation",
        "size",
    )

    def __init__(self, ordinal: int, node: str, gpu_type: str):
        self.ordinal = ordinal
        self.node = node
        self.gpu_type = gpu_type
        self.size = 0
        self.free_ids: list[Id] = []  # lowest device index first
        self.latest_end = -_NEVER  # when its busiest GPU is expected to be free
        self.ends: list[float] = []  # expected release time of every GPU that is not free
        self._ends_sorted = True
        self.allocations: list[RunningAllocation] = []
        self.reservation: Reservation | None = None
        # A node whose GPUs are being freed by a preemption is not targeted again until
        # the victims are gone (hysteresis).
        self.preemption_locked = False

    @property
    def free(self) -> int:
        return len(self.free_ids)

    def _sorted_ends(self) -> list[float]:
        if not self._ends_sorted:
            self.ends.sort()
            self._ends_sorted = True
        return self.ends

    def earliest_start(self, count: int, now: float) -> float:
        """When `count` GPUs of this pool will be free (infinity if it is too small)."""
        missing = count - len(self.free_ids)
        if missing <= 0:
            return now
        ends = self._sorted_ends()
        if missing > len(ends):
            return _NEVER
        return max(now, ends[missing - 1])

    def available_by(self, moment: float) -> int:
        return len(self.free_ids) + bisect.bisect_right(self._sorted_ends(), moment)

    def take(self, count: int, end: float) -> tuple[Id, ...]:
        self.latest_end = max(self.latest_end, end)
        taken = tuple(self.free_ids[:count])
        del self.free_ids[:count]
        if self._ends_sorted:
            for _ in range(count):
                bisect.insort(self.ends, end)
        else:
            self.ends.extend([end] * count)
        return taken


class CapacityIndex:
    """Active pools indexed by (GPU type, free count); the policy's view of the fleet.

    Guarantees: only GPUs that are marked free *and* held by no allocation are ever handed
    out, each at most once per call; pools of draining or down nodes are not indexed.
    """

    def __init__(
        self,
        nodes: Sequence[Node],
        running: Sequence[RunningAllocation],
        gpu_types: Iterable[GpuType],
        now: float,
        stop_delay_s: float,
    ):
        self.now = now
        self.gpu_types: dict[str, GpuType] = {t.name: t for t in gpu_types}
        self.pools: list[Pool] = []
        self.pools_by_type: dict[str, list[Pool]] = {}
        self.pool_by_node_type: dict[tuple[str, str], Pool] = {}
        self.total_gpus = 0  # GPUs on active nodes: the capacity shares are fractions of
        self.free_gpus = 0
        # GPU type -> free count -> ordinals of the pools with that many free GPUs, sorted
        # (plain lists + bisect: a few thousand ints move faster than a tree rebalances).
        self._buckets: dict[str, dict[int, list[int]]] = {}
        self._max_size: dict[str, int] = {}
        self._type_order_cache: dict[tuple[tuple[str, ...], float], tuple[str, ...]] = {}
        self._largest_pool: dict[tuple[str, ...], int] = {}  # allowed types -> GPUs
        # (allowed types, count) -> the earliest end for which `best_fit` found nothing:
        # capacity only shrinks within a call (until a reservation goes), and a job that
        # ends later is admitted by fewer pools, so a later end cannot fit either.
        self._no_fit: dict[tuple[tuple[str, ...], int], float] = {}
        self._reserved_jobs: dict[Id, int] = {}  # job id -> reservations it holds
        self._start_heaps: dict[tuple[str, int], list[tuple[float, int]]] = {}

        held: set[Id] = set()
        for allocation in running:
            held.update(allocation.gpu_ids)
        pool_of_gpu: dict[Id, Pool] = {}
        pools, pools_by_type, pool_by_node_type = self.pools, self.pools_by_type, {}
        for node in nodes:
            if node.state != NodeState.ACTIVE:
                continue
            node_pools: dict[str, Pool] = {}
            for gpu in node.gpus:
                gpu_type = gpu.type
                pool = node_pools.get(gpu_type)
                if pool is None:
                    pool = node_pools[gpu_type] = Pool(len(pools), node.name, gpu_type)
                    pools.append(pool)
                    pools_by_type.setdefault(gpu_type, []).append(pool)
                    pool_by_node_type[(node.name, gpu_type)] = pool
                pool.size += 1
                gpu_id = gpu.id
                pool_of_gpu[gpu_id] = pool
                if gpu_id in held:
                    continue
                if gpu.free:
                    pool.free_ids.append((gpu.index, gpu_id))
                else:
                    pool.ends.append(_NEVER)  # busy, but we do not know until when
            for pool in node_pools.values():
                free_ids = pool.free_ids
                if len(free_ids) > 1:
                    free_ids.sort(key=_by_first)  # lowest device index first
                pool.free_ids = [gpu_id for _, gpu_id in free_ids]
        self.pool_by_node_type = pool_by_node_type
        self.total_gpus = len(pool_of_gpu)
        self.node_count = len({pool.node for pool in pools})

        get_pool = pool_of_gpu.get
        for allocation in running:
            stopping = allocation.stopping
            end = now + stop_delay_s if stopping else max(now, allocation.expected_end)
            for gpu_id in allocation.gpu_ids:
                pool = get_pool(gpu_id)
                if pool is None:
                    continue  # on a draining/down node: not part of what we schedule
                pool.ends.append(end)
                attached = pool.allocations
                if not attached or attached[-1] is not allocation:
                    attached.append(allocation)
                    if stopping:
                        pool.preemption_locked = True
        buckets, max_size, free_gpus = self._buckets, self._max_size, 0
        for pool in pools:
            gpu_type = pool.gpu_type
            pool._ends_sorted = False
            if pool.ends:
                pool.latest_end = max(pool.ends)
            else:
                pool.latest_end = now
            if pool.size > max_size.get(gpu_type, 0):
                max_size[gpu_type] = pool.size
            free = len(pool.free_ids)
            if free:
                by_free = buckets.get(gpu_type)
                if by_free is None:
                    by_free = buckets[gpu_type] = {}
                bucket = by_free.get(free)
                if bucket is None:
                    by_free[free] = [pool.ordinal]
                else:
                    bucket.append(pool.ordinal)  # ordinals ascend
                free_gpus += free
        self.free_gpus = free_gpus

    def _bucket(self, gpu_type: str, free: int) -> list[int]:
        buckets = self._buckets.setdefault(gpu_type, {})
        bucket = buckets.get(free)
        if bucket is None:
            bucket = buckets[free] = []
        return bucket

    # -- what a job may use ------------------------------------------------------------

    def allowed_types(self, job: QueuedJob) -> tuple[str, ...]:
        """The job's allowed GPU types that meet its memory floor, most preferred first.

        "Any type" (an empty list) means every type, cheapest first: a job that does not
        care should not take the premium GPUs others asked for by name."""
        key = (job.gpu_types, job.min_gpu_memory_gb)
        cached = self._type_order_cache.get(key)
        if cached is None:
            floor = job.min_gpu_memory_gb
            if job.gpu_types:
                names = dict.fromkeys(job.gpu_types)  # de-duplicate, keep preference order
            else:
                names = sorted(
                    self.gpu_types.values(),
                    key=lambda t: (t.price_per_gpu_hour, t.memory_gb, t.name),
                )
                names = [t.name for t in names]
            cached = tuple(
                name
                for name in names
                if name in self.gpu_types and self.gpu_types[name].memory_gb >= floor
            )
            self._type_order_cache[key] = cached
        return cached

    def could_ever_fit(self, types: tuple[str, ...], count: int) -> bool:
        """Whether some active pool of these types is big enough, free or not."""
        largest = self._largest_pool.get(types)
        if largest is None:
            largest = self._largest_pool[types] = max(
                (self._max_size.get(t, 0) for t in types), default=0
            )
        return count <= largest

    def has_room(self, types: tuple[str, ...], count: int) -> bool:
        """Whether some pool of these types has `count` free GPUs (reservations aside)."""
        for gpu_type in types:
            buckets = self._buckets.get(gpu_type)
            if not buckets:
                continue
            for free in range(count, self._max_size[gpu_type] + 1):
                if buckets.get(free):
                    return True
        return False

    # -- placement ---------------------------------------------------------------------

    def best_fit(
        self,
        types: tuple[str, ...],
        count: int,
        end: float,
        job_id: Id | None = None,
        avoid: frozenset[str] = frozenset(),
        *,
        rank: int = -1,
    ) -> Pool | None:
        """The pool for a job of `count` GPUs held until `end`; a pool on a node in
        `avoid` (where the job failed before) only if no other pool fits.

        Most preferred type with room first; within it, the fewest free GPUs that still
        hold the job (best fit: large holes stay whole for multi-GPU jobs); among pools
        with that many free GPUs (up to `TIME_FIT_CANDIDATES` of them), the one whose
        busy GPUs run latest past `end` — so a node's jobs tend to end together and it
        frees up whole, instead of being kept busy by one straggler. Honours every
        reservation except the job's own. At most `BUCKET_VISITS` pools are looked at
        per free count, so the cost per placement does not depend on the fleet size.
        Deterministic (lowest ordinal on ties). A failure is remembered until a
        reservation is released, so jobs of the same shape that end no earlier fail in
        O(1) (a job holding a reservation always searches). `rank` is the tier rank of
        the job: a drain open to higher tiers is open to it where it holds for a lower
        tier's job (a preemption's claim never is)."""
        key = (types, count, rank)
        cacheable = job_id is None or job_id not in self._reserved_jobs
        if cacheable:
            failed_end = self._no_fit.get(key)
            if failed_end is not None and end >= failed_end:
                return None
        pool = None
        if avoid:
            pool = self._best_fit(types, count, end, job_id, avoid, rank)
        if pool is None:
            pool = self._best_fit(types, count, end, job_id, frozenset(), rank)
        if pool is None and cacheable:
            failed_end = self._no_fit.get(key)
            if failed_end is None or end < failed_end:
                self._no_fit[key] = end
        return pool

    def _best_fit(
        self,
        types: tuple[str, ...],
        count: int,
        end: float,
        job_id: Id | None,
        avoid: frozenset[str] = frozenset(),
        rank: int = -1,
    ):
        for gpu_type in types:
            buckets = self._buckets.get(gpu_type)
            if not buckets:
                continue
            for free in range(count, self._max_size[gpu_type] + 1):
                bucket = buckets.get(free)
                if not bucket:
                    continue
                best, best_extension, seen = None, _NEVER, 0
                pools = self.pools
                for visited, ordinal in enumerate(bucket):
                    if visited >= BUCKET_VISITS:
                        break  # many reserved pools here: bounded work, try larger holes
                    pool = pools[ordinal]
                    if avoid and pool.node in avoid:
                        continue
                    reservation = pool.reservation
                    if reservation is not None and not (
                        reservation.job_id == job_id
                        or end <= reservation.start
                        or count <= reservation.surplus
                        or (
                            reservation.open_to_higher_tiers
                            and reservation.rank < rank
                            and not reservation.claim
                        )
                    ):
                        continue
                    # How much this job would extend the time until the pool is free
                    # (ties: lowest ordinal, the bucket's order).
                    extension = end - pool.latest_end
                    if extension < best_extension:
                        best, best_extension = pool, extension
                        if extension <= 0.0:
                            break
                    seen += 1
                    if seen >= TIME_FIT_CANDIDATES:
                        break
                if best is not None:
                    return best
        return None

    def take(self, pool: Pool, count: int, end: float, job_id: Id | None = None) -> tuple[Id, ...]:
        """Hand `count` free GPUs of `pool` to a job that will hold them until `end`."""
        if count > pool.free:
            raise ValueError(f"pool {pool.node}/{pool.gpu_type} has only {pool.free} free GPUs")
        bucket = self._bucket(pool.gpu_type, pool.free)
        del bucket[bisect.bisect_left(bucket, pool.ordinal)]
        taken = pool.take(count, end)
        if pool.free:
            bisect.insort(self._bucket(pool.gpu_type, pool.free), pool.ordinal)
        self.free_gpus -= count
        reservation = pool.reservation
        if reservation is not None:
            if reservation.job_id == job_id:
                self._forget(reservation)  # fulfilled
            elif end > reservation.start:
                reservation.surplus = max(0, reservation.surplus - count)
        return taken

    # -- reservations ------------------------------------------------------------------

    def earliest_pool(
        self, types: tuple[str, ...], count: int
    ) -> tuple[Pool, float] | tuple[None, float]:
        """The unreserved pool where `count` GPUs of an allowed type free up first, and when.

        Ties go to the more preferred type, then the lower ordinal. Each (type, count) has
        a lazily built min-heap of (start, ordinal): a pool's start only moves later
        within a call (placements add work; nothing frees up), so a stale entry is
        re-keyed when it surfaces, and a query costs O(log pools) amortised after an
        O(pools) build per (type, count) per call."""
        best: Pool | None = None
        best_key: tuple[float, int, int] | None = None
        for rank, gpu_type in enumerate(types):
            heap = self._start_heap(gpu_type, count)
            while heap:
                start, ordinal = heap[0]
                pool = self.pools[ordinal]
                if pool.reservation is not None:
                    heapq.heappop(heap)  # reserved pools stay reserved for the whole call
                    continue
                actual = pool.earliest_start(count, self.now)
                if actual > start:
                    heapq.heapreplace(heap, (actual, ordinal))
                    continue
                key = (start, rank, ordinal)
                if best_key is None or key < best_key:
                    best, best_key = pool, key
                break
        if best is None:
            return None, _NEVER
        return best, best_key[0]

    def _start_heap(self, gpu_type: str, count: int) -> list[tuple[float, int]]:
        heap = self._start_heaps.get((gpu_type, count))
        if heap is None:
            heap = [
                (pool.earliest_start(count, self.now), pool.ordinal)
                for pool in self.pools_by_type.get(gpu_type, ())
                if pool.size >= count and pool.reservation is None
            ]
            heapq.heapify(heap)
            self._start_heaps[(gpu_type, count)] = heap
        return heap

    def reserve(
        self,
        pool: Pool,
        job: QueuedJob,
        start: float,
        claim: bool = False,
        *,
        open_to_higher_tiers: bool = False,
    ) -> Reservation:
        reservation = Reservation(
            job_id=job.id,
            start=start,
            count=job.gpu_count,
            surplus=max(0, pool.available_by(start) - job.gpu_count),
            claim=claim,
            pool_ordinal=pool.ordinal,
            rank=TIER_RANK.get(job.tier, 0),
            open_to_higher_tiers=open_to_higher_tiers and not claim,
        )
        replaced = pool.reservation
        if replaced is not None:
            self._forget(replaced)
        pool.reservation = reservation
        self._reserved_jobs[job.id] = self._reserved_jobs.get(job.id, 0) + 1
        return reservation

    def release(self, reservation: Reservation) -> None:
        if self.pools[reservation.pool_ordinal].reservation is reservation:
            self._forget(reservation)

    def _forget(self, reservation: Reservation) -> None:
        """The pool is no longer reserved: more room than before for everyone else."""
        self.pools[reservation.pool_ordinal].reservation = None
        held = self._reserved_jobs.pop(reservation.job_id, 0) - 1
        if held > 0:
            self._reserved_jobs[reservation.job_id] = held
        self._no_fit.clear()


def _by_first(item: tuple) -> int:
    return item[0]
