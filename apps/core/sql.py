"""Prepared, server-side-bound statements on Django's connection, for the hot paths.

Django binds parameters client-side and never prepares. The hot paths (ledger
reserve/settle/fold, job submission) instead run fixed statement texts through
`execute`: bound server-side and prepared on first use (our settings turn psycopg's
prepare_threshold on), so PostgreSQL parses and plans each once per connection;
planning their CTEs cost about half of the database's CPU per call before.
"""

# SQL given to `execute` is the caller's own constant text; values are always bound
# parameters.

from __future__ import annotations

import functools
import re
import uuid
from datetime import datetime, timedelta

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import DateTimeField, DurationField, Func, Value
from django.db.models.expressions import DatabaseDefault
from django.db.models.functions import Now

_PLACEHOLDER = re.compile(r"%\((\w+)\)[sb]|%[sb]|%%")


@functools.lru_cache(maxsize=256)
def _native(sql: str) -> tuple[str, tuple[str, ...]]:
    """Turn %(name)s / %(name)b (or positional %s / %b) placeholders into PostgreSQL's
    $n, once per statement text: psycopg would re-parse statements longer than 4 kB on
    every call. Whitespace is collapsed too, so this SQL has no comments and no
    multi-line literals. Returns (SQL, parameter names in $n order; () if positional)."""
    names: list[str] = []
    positional = iter(range(1, 10_000))

    def number(match: re.Match) -> str:
        if match.group(0) == "%%":
            return "%"
        if match.group(1) is None:
            return f"${next(positional)}"
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return " ".join(_PLACEHOLDER.sub(number, sql).split()), tuple(names)


def execute(pg: psycopg.Connection, sql: str, params) -> psycopg.RawCursor:
    """Run a statement on Django's connection (in its current transaction), bound
    server-side and prepared on first use. Parameters are named (a dict) or positional
    (a list); a list goes as a PostgreSQL array literal (cast it in the SQL unless the
    target column types it), results come back binary. `pg` is Django's psycopg
    connection (`connection.connection`, after `ensure_connection()`)."""
    cursor = psycopg.RawCursor(pg)
    native, names = _native(sql)
    values = [params[n] for n in names] if names else params
    cursor.execute(
        native,
        [array_literal(v) if isinstance(v, list) else v for v in values],
        binary=True,
        prepare=True,
    )
    return cursor


def execute_last(db, sql: str, params) -> None:
    """Run the last statement of the current atomic block, and when that block is the
    outermost one (it commits on exit), send COMMIT with it: one round trip instead of
    two. `db` is Django's connection wrapper (`connections[alias]`).

    Django's atomic exit then finds the transaction committed (psycopg's commit() does
    nothing on an idle connection) and runs the on_commit callbacks as usual. So nothing
    may run in the block after this call: it is committed already. A COMMIT that fails
    (a deferred constraint) raises here, inside the block, which then rolls back (a no-op).
    Inside an outer atomic block (a savepoint) it is a plain `execute`: the outer block
    commits.
    """
    db.ensure_connection()
    pg = db.connection
    if not commits_on_exit(db):
        execute(pg, sql, params)
        return
    with pg.pipeline():
        execute(pg, sql, params)
        pg.execute("COMMIT")


def commits_on_exit(db) -> bool:
    """Whether the current atomic block of `db` is the outermost one, which commits when
    it exits: a COMMIT may then be sent with its last statement (see execute_last)."""
    return bool(
        db.in_atomic_block and db.commit_on_exit and not db.savepoint_ids and not db.needs_rollback
    )


# Types whose str() is already their array element text.
_PLAIN_TYPES = frozenset({int, uuid.UUID})


def array_literal(values: list) -> str:
    """A list as PostgreSQL array text ('{...}'). Building it costs a fraction of
    psycopg's per-element array adaptation, which dominated the write path's CPU; ids
    and amounts (most of the ledger's arrays) take a faster way still."""
    if set(map(type, values)) <= _PLAIN_TYPES:
        return "{" + ",".join(map(str, values)) + "}"
    return "{" + ",".join(map(_array_element, values)) + "}"


def _array_element(value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)  # int, UUID


class NowPlus(Func):
    """The statement's timestamp (the database clock, as Now() writes it) plus `delta`.

    A deadline computed by PostgreSQL when the row is written, never by an application
    server's clock. Django's ORM renders it like any expression; insert_rows binds the
    delta as an interval."""

    template = "(STATEMENT_TIMESTAMP() + %(expressions)s)"
    output_field = DateTimeField()

    def __init__(self, delta: timedelta):
        self.delta = delta
        super().__init__(Value(delta, output_field=DurationField()))


def insert_rows(*instances, last: bool = False) -> None:
    """INSERT new model instances in one statement and one round trip.

    What Model.save() would write for each concrete field (auto_now_add and Python
    defaults applied; database defaults left to the database; Now() as the statement's
    timestamp, like Django's, and NowPlus as that timestamp plus its interval), without
    its per-row query compilation: this is the submission hot path. Plain rows only: no
    signals, no auto-increment primary keys returned. Foreign keys among the rows are
    checked at commit (Django creates them DEFERRABLE INITIALLY DEFERRED), so the order
    of the inserts does not matter.

    `last`: nothing else runs in the current atomic block after this; if it is the
    outermost block, the COMMIT is sent with the INSERT (apps.core.sql.execute_last).
    """
    db = connections[DEFAULT_DB_ALIAS]  # the real wrapper: the proxy costs per access
    sql, params = insert_statement(*instances)
    if last:
        execute_last(db, sql, params)
    else:
        db.ensure_connection()
        execute(db.connection, sql, params)
    mark_inserted(*instances)


def insert_statement(*instances) -> tuple[str, list]:
    """(SQL, parameters) of the INSERT that insert_rows runs, for a caller that sends it
    itself (in another statement's round trip); then call mark_inserted."""
    db = connections[DEFAULT_DB_ALIAS]
    shape, params = [], []
    for instance in instances:
        kinds = []
        for model_field in _insert_fields(type(instance)):
            value = model_field.pre_save(instance, add=True)
            if isinstance(value, DatabaseDefault) or (
                value is None and model_field.primary_key and model_field.db_returning
            ):
                kinds.append(_DEFAULT)  # the database fills it in
            elif isinstance(value, Now):
                kinds.append(_NOW)
            elif isinstance(value, NowPlus):
                kinds.append(_NOW_PLUS)
                params.append(value.delta)  # bound as an interval
            elif hasattr(value, "resolve_expression"):
                raise TypeError(f"{model_field.name}: unsupported expression {value!r}")
            else:
                kinds.append(_VALUE)
                params.append(model_field.get_db_prep_save(value, db))
        shape.append((type(instance), tuple(kinds)))
    shape = tuple(shape)
    sql = _insert_sql.get(shape)
    if sql is None:
        sql = _insert_sql[shape] = _build_insert_sql(shape, db.ops.quote_name)
    return sql, params


def mark_inserted(*instances) -> None:
    """Mark instances written by insert_statement's SQL as saved (as Model.save would)."""
    for instance in instances:
        instance._state.adding = False
        instance._state.db = DEFAULT_DB_ALIAS


# How insert_rows writes each column of a row.
_VALUE, _NOW, _NOW_PLUS, _DEFAULT = "value", "now", "now_plus", "default"
# The statement text depends only on the models and which columns are defaulted or Now():
# built once per such shape (its columns walked and quoted once, not per submission).
_insert_sql: dict[tuple, str] = {}


_VALUE_SQL = {
    _VALUE: "%s",
    _NOW: "STATEMENT_TIMESTAMP()",
    _NOW_PLUS: "STATEMENT_TIMESTAMP() + %s",
}


@functools.cache
def _insert_fields(model) -> tuple:
    return tuple(model._meta.concrete_fields)


def _build_insert_sql(shape: tuple, quote) -> str:
    statements = []
    for model, kinds in shape:
        columns, values = [], []
        for model_field, kind in zip(_insert_fields(model), kinds, strict=True):
            if kind == _DEFAULT:
                continue
            columns.append(quote(model_field.column))
            values.append(_VALUE_SQL[kind])
        table = quote(model._meta.db_table)
        # Identifiers from model metadata (quoted); every value is a bound parameter.
        statements.append(
            f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(values)})"  # noqa: S608
        )
    # Data-modifying CTEs: all rows in one statement of the current transaction, bound
    # server-side and prepared.
    *first, last = statements
    ctes = ", ".join(f"w{i} AS ({stmt})" for i, stmt in enumerate(first))
    return f"WITH {ctes} {last}" if ctes else last
