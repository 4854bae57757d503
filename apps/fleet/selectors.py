"""Reads of the fleet's inventory: GPU types and their prices, cached per process."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from django.conf import settings

from apps.fleet.models import GpuType


@dataclass(frozen=True)
class GpuTypeInfo:
    name: str
    memory_gb: int
    price_per_gpu_hour: int


class _GpuTypeCache:
    """GPU types per process for GANTRY_GPU_TYPE_CACHE_S: read on every submission."""

    def __init__(self):
        self._lock = threading.Lock()
        self._types: dict[str, GpuTypeInfo] | None = None
        self._loaded_at = 0.0

    def get(self, *, refresh: bool = False) -> dict[str, GpuTypeInfo]:
        now = time.monotonic()
        with self._lock:
            fresh = now - self._loaded_at < settings.GANTRY_GPU_TYPE_CACHE_S
            if self._types is not None and fresh and not refresh:
                return self._types
        types = {
            row.name: GpuTypeInfo(row.name, row.memory_gb, row.price_per_gpu_hour)
            for row in GpuType.objects.all()
        }
        with self._lock:
            self._types, self._loaded_at = types, now
        return types

    def clear(self) -> None:
        with self._lock:
            self._types, self._loaded_at = None, 0.0


_gpu_types = _GpuTypeCache()


def gpu_types(*, refresh: bool = False) -> dict[str, GpuTypeInfo]:
    """Every GPU type by name (cached briefly; `refresh` reads the database now)."""
    return _gpu_types.get(refresh=refresh)


def clear_gpu_type_cache() -> None:
    _gpu_types.clear()
