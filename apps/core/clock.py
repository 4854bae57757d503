"""The database clock: the one clock that decides leases, expiry and usage windows.

Workers' wall clocks may be skewed; PostgreSQL's is shared by every process.
"""

from __future__ import annotations

from datetime import datetime

from django.db import connection


def db_now() -> datetime:
    """The database's time at this statement (not at the transaction's start)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        return cursor.fetchone()[0]
