"""Python's cyclic garbage collector, paused around a round's allocations."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def garbage_collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for the block, and resume it after (if it was
    on): for a section that allocates a great many objects that form no reference
    cycles, such as reading a snapshot of 100,000 queued jobs or a dispatch round.
    Each pass of the collector rescans every long-lived object of the process, and
    such a section triggers several (on the 100,000 one-job users of bench/dispatch.py,
    two full passes took a tenth of the snapshot's read); reference counting frees what
    the block allocates all the same, and a cycle it makes waits for the next pass."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
