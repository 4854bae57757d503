"""Row ids: time-ordered UUIDs (version 7, RFC 9562).

A random (version 4) key sends each insert to a random leaf of its B-tree index: at a
platform's sizes that leaf is rarely in memory, and the first write to each leaf after a
checkpoint logs a full 8 KB page image. A version-7 id starts with its millisecond, so
the rows of one moment share the right-most leaves of every index keyed by them (the
primary keys, and the foreign keys that point at new rows: a job's hold, an entry's
job). After its millisecond the id is random (less a counter that keeps one process's
ids in order), so it cannot be guessed; it does reveal its creation time to the
millisecond, which the API shows anyway (`created_at`).
"""

from __future__ import annotations

import uuid

from uuid_utils.compat import uuid7


def new_id() -> uuid.UUID:
    """A fresh row id: unique, time-ordered (monotonic within a process), a standard
    `uuid.UUID`."""
    return uuid7()
