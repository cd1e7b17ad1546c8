"""Fast path: database helpers for hot paths: many rows in one statement, without model
instances, and reads compiled once (`CompiledQuery`) for the loops that run the same queries
back to back.

Justified by `bench.fast_paths` (each compiled read against the ORM's way, per site: 1.9x to
6.6x where kept; `insert_instances` against `bulk_create`, 1.55x) and `bench.cycle_scale` (the
cycle's reads and writes), `bench.bulk_rows` (these
writes against Django's `bulk_create` / `bulk_update`: about 2× and 30× slower on the cycle's
rows), `bench.submit_throughput` (`insert_instances`, per-submission compiled reads) and
`bench.slurm_metering` (usage records and meters written by `insert_rows`) and `bench.agent_cost`
(the heartbeat's compiled read of the curated images).

On PostgreSQL every column travels as one array parameter and the statement reads them back
with `unnest`, so the SQL stays a few lines long whatever the row count (no per-row
placeholders to build and parse). Elsewhere (SQLite, the embedded demo) they fall back to
Django's `bulk_update` / `bulk_create`, and compiled reads to plain querysets; `tests/embedded`
runs those fallbacks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import Any, Generic, TypeVar, overload

from django.core.exceptions import EmptyResultSet
from django.db import DEFAULT_DB_ALIAS, connection, connections, models
from django.db.models import Expression, Field, FloatField, Func, Lookup, QuerySet

# Rows per statement: bounds the size of one query's parameters.
CHUNK = 5000


def _columns(model: type[models.Model], fields: Sequence[str]) -> list[models.Field[Any, Any]]:
    cols = [f for f in (model._meta.get_field(n) for n in fields) if isinstance(f, models.Field)]
    if len(cols) != len(fields):
        raise ValueError("bulk updates change concrete fields only")
    return cols


# Field types whose database value is the Python value itself on PostgreSQL, for the plain
# values below; anything else goes through the field's own `get_db_prep_save`.
_PLAIN_FIELDS = frozenset(
    {
        "AutoField",
        "BigAutoField",
        "BigIntegerField",
        "BooleanField",
        "CharField",
        "ForeignKey",
        "IntegerField",
        "PositiveBigIntegerField",
        "PositiveIntegerField",
        "PositiveSmallIntegerField",
        "SmallIntegerField",
        "TextField",
    }
)
_PLAIN_VALUES = (int, str, bool, type(None))


def _array_params(
    cols: Sequence[models.Field[Any, Any]], rows: Sequence[tuple[Any, ...]]
) -> tuple[list[str], list[list[Any]]]:
    """One `%s::type[]` placeholder and one list of database values per column.

    With parameters bound on the server (the default, `config.settings`), a column of plain
    integers, strings, booleans, dates or datetimes travels in PostgreSQL's binary format
    (`%b`): psycopg writes such arrays as text element by element in Python, 2-13× slower
    (`bench.slurm_metering`); decimals stay text, which psycopg writes faster."""
    conn = connections[DEFAULT_DB_ALIAS]
    binary = bool(conn.settings_dict.get("OPTIONS", {}).get("server_side_binding"))
    casts: list[str] = []
    arrays: list[list[Any]] = []
    for i, c in enumerate(cols):
        values = [row[i] for row in rows]
        kind = c.get_internal_type()
        if kind == "ForeignKey":
            kind = c.target_field.get_internal_type()  # type: ignore[attr-defined]
        if kind in _PLAIN_FIELDS:
            plain = all(type(v) in _PLAIN_VALUES for v in values)
        elif kind == "DateTimeField":  # aware datetimes are passed as they are
            plain = all(v is None or (isinstance(v, datetime) and v.tzinfo) for v in values)
        elif kind == "DateField":
            plain = all(v is None or type(v) is date for v in values)
        elif kind == "DecimalField":  # Django passes a Decimal on unchanged here too
            plain = all(v is None or type(v) is Decimal for v in values)
        else:
            plain = False
        arrays.append(values if plain else [c.get_db_prep_save(v, conn) for v in values])
        mark = "%b" if binary and plain and kind != "DecimalField" else "%s"
        casts.append(f"{mark}::{c.db_type(conn)}[]")
    return casts, arrays


def bulk_update_rows(
    model: type[models.Model],
    fields: Sequence[str],
    rows: Sequence[tuple[Any, ...]],
    *,
    skip_locked_where: Mapping[str, Any] | None = None,
) -> int:
    """Update many rows given as `(pk, value, ...)` tuples; returns how many were updated.

    With `skip_locked_where` (field → value), only rows that still match it and that no other
    transaction holds are updated (`FOR UPDATE SKIP LOCKED`); the others keep their values.
    """
    if not rows:
        return 0
    cols = _columns(model, fields)
    if connection.vendor != "postgresql":
        return _bulk_update_fallback(model, fields, rows, skip_locked_where)
    pk = model._meta.pk
    assert pk is not None and pk.column is not None
    qn = connection.ops.quote_name
    table = qn(model._meta.db_table)
    pk_col = qn(pk.column)
    names = ["id_", *[f"c{i}" for i in range(len(cols))]]
    assignments = ", ".join(f"{qn(str(c.column))} = v.c{i}" for i, c in enumerate(cols))
    guard_cols = _columns(model, list(skip_locked_where or {}))
    guard_values = list((skip_locked_where or {}).values())
    # Identifiers come from the model's metadata and values are parameters.
    if skip_locked_where is not None:
        where = " AND ".join(
            [f"{pk_col} = ANY(%s::{pk.db_type(connection)}[])"]
            + [f"{qn(str(c.column))} = %s" for c in guard_cols]
        )
        head = (
            f"WITH free AS (SELECT {pk_col} AS id_ FROM {table} WHERE {where} "  # noqa: S608
            f"ORDER BY {pk_col} FOR UPDATE SKIP LOCKED) "
        )
        join = "JOIN free ON free.id_ = v.id_ "
    else:
        head = join = ""
    total = 0
    for start in range(0, len(rows), CHUNK):
        chunk = rows[start : start + CHUNK]
        casts, arrays = _array_params([pk, *cols], chunk)
        params: list[Any] = []
        if skip_locked_where is not None:
            params.append(arrays[0])
            params += [
                c.get_db_prep_value(v, connection)
                for c, v in zip(guard_cols, guard_values, strict=True)
            ]
        params += arrays
        sql = (
            f"{head}UPDATE {table} AS t SET {assignments} "  # noqa: S608
            f"FROM (SELECT * FROM unnest({', '.join(casts)}) AS u({', '.join(names)})) AS v "
            f"{join}WHERE t.{pk_col} = v.id_"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            total += cursor.rowcount
    return total


def _bulk_update_fallback(
    model: type[models.Model],
    fields: Sequence[str],
    rows: Sequence[tuple[Any, ...]],
    skip_locked_where: Mapping[str, Any] | None,
) -> int:
    by_pk = {row[0]: row for row in rows}
    if skip_locked_where is not None:
        free = (
            model._default_manager.select_for_update(skip_locked=True)
            .filter(pk__in=list(by_pk), **skip_locked_where)
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        by_pk = {pk: by_pk[pk] for pk in free}
    names = [c.attname for c in _columns(model, fields)]  # rows carry ids for foreign keys
    objs = [model(pk=row[0], **dict(zip(names, row[1:], strict=True))) for row in by_pk.values()]
    updated: int = model._default_manager.bulk_update(objs, fields, batch_size=500)
    return updated


def insert_rows(
    model: type[models.Model],
    fields: Sequence[str],
    rows: Sequence[tuple[Any, ...]],
    *,
    ignore_conflicts: bool = False,
    update_conflicts: Sequence[str] = (),
    unique_fields: Sequence[str] = (),
) -> int:
    """Insert many rows given as value tuples in `fields` order, without model instances.

    Nothing model-side runs: callers pass every column that has no database default
    (`auto_now_add` and Python `default=` values included). As with `bulk_create`:
    `ignore_conflicts` skips rows that break a unique constraint (`ON CONFLICT DO NOTHING`),
    `update_conflicts` (fields) overwrites those of the row already there that has the same
    `unique_fields`. Returns how many rows were written (inserted or updated; on SQLite, the
    rows given).
    """
    if not rows:
        return 0
    cols = _columns(model, fields)
    if update_conflicts and not unique_fields:
        raise ValueError("update_conflicts needs the unique_fields that identify a row")
    if connection.vendor != "postgresql":
        attnames = [c.attname for c in cols]  # `job_id`, not `job`: rows carry ids
        objs = [model(**dict(zip(attnames, row, strict=True))) for row in rows]
        model._default_manager.bulk_create(
            objs,
            batch_size=500,
            ignore_conflicts=ignore_conflicts,
            update_conflicts=bool(update_conflicts),
            update_fields=list(update_conflicts) or None,
            unique_fields=list(unique_fields) or None,
        )
        return len(objs)
    qn = connection.ops.quote_name
    table = qn(model._meta.db_table)
    names = ", ".join(qn(str(c.column)) for c in cols)
    conflict = ""
    if update_conflicts:
        keys = ", ".join(qn(str(c.column)) for c in _columns(model, unique_fields))
        sets = ", ".join(
            f"{qn(str(c.column))} = EXCLUDED.{qn(str(c.column))}"
            for c in _columns(model, update_conflicts)
        )
        conflict = f" ON CONFLICT ({keys}) DO UPDATE SET {sets}"
    elif ignore_conflicts:
        conflict = " ON CONFLICT DO NOTHING"
    total = 0
    for start in range(0, len(rows), CHUNK):
        chunk = rows[start : start + CHUNK]
        casts, arrays = _array_params(cols, chunk)
        sql = (
            f"INSERT INTO {table} ({names}) "  # noqa: S608 - names from _meta
            f"SELECT * FROM unnest({', '.join(casts)}){conflict}"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, arrays)
            total += cursor.rowcount
    return total


ModelT = TypeVar("ModelT", bound=models.Model)


def concrete_columns(model: type[models.Model]) -> list[str]:
    """The attribute names of a model's concrete fields, in order: what a compiled read
    selects to build whole instances with `instance_from_row`."""
    return [f.attname for f in model._meta.concrete_fields]


def instance_from_row(model: type[ModelT], row: Sequence[Any]) -> ModelT:
    """A model instance, as if loaded by the ORM, from a row of `concrete_columns(model)`."""
    return model.from_db(DEFAULT_DB_ALIAS, concrete_columns(model), row)


# Statements kept per model for 1 to this many rows (a job's events, one audit event); larger
# batches vary in size and go to `bulk_create`, so the cache stays small.
INSERT_SQL_MAX_ROWS = 8
# Per model: its fields, each with the one type of value (besides None) whose database value
# is that value itself (`_plain_type`), or None where every value is prepared.
_INSERT_FIELDS: dict[type[models.Model], list[tuple[Field[Any, Any], str, type | None]]] = {}
# Statements by model and which values are NULL (written into the statement: fewer
# parameters to send, and a job's row stays within the 50 parameters whose conversion to
# PostgreSQL's placeholders psycopg caches); at most this many kept.
_INSERT_SQL: dict[tuple[type[models.Model], tuple[bool, ...]], str] = {}
INSERT_SQL_KEPT = 256
# Exact field classes (a subclass may prepare its values otherwise) whose `pre_save` and
# `get_db_prep_save` return a value of this type unchanged on PostgreSQL (None too).
_PLAIN_INSERT: dict[type, type] = {
    models.AutoField: int,
    models.BigAutoField: int,
    models.BigIntegerField: int,
    models.BooleanField: bool,
    models.CharField: str,
    models.IntegerField: int,
    models.PositiveBigIntegerField: int,
    models.PositiveIntegerField: int,
    models.PositiveSmallIntegerField: int,
    models.SmallIntegerField: int,
    models.TextField: str,
}
_NOT_SET = object()


def _plain_type(field: Field[Any, Any]) -> type | None:
    if type(field) is models.ForeignKey:
        field = field.target_field
    return _PLAIN_INSERT.get(type(field))


def insert_instances(*groups: Sequence[models.Model]) -> None:
    """Insert unsaved instances (each group of one model, with an auto primary key) in one
    statement, whatever the number of groups.

    What `bulk_create` does, each field's `pre_save` (`auto_now_add`) and preparation for the
    database included, but with the SQL built once per model and pattern of NULLs (up to
    `INSERT_SQL_MAX_ROWS` rows), not per call, and a plain field's value (an int of a number field
    or of a foreign key to an integer key, a str of a text field, a bool of a boolean, None)
    passed as it is, which is what its preparation would return: the submit path writes a
    job, its events and an audit event on every request (`bench.submit_cost`). Several groups
    (a job's events and its audit event) go in one statement, one `INSERT` each in a `WITH`,
    so one round trip. Primary keys are set from RETURNING. No signals, as with `bulk_create`.
    PostgreSQL; elsewhere it is `bulk_create`, a group at a time.
    """
    groups = tuple(group for group in groups if group)
    if not groups:
        return
    if connection.vendor != "postgresql" or any(len(g) > INSERT_SQL_MAX_ROWS for g in groups):
        for group in groups:  # large batches: Django's `unnest` insert
            type(group[0])._default_manager.bulk_create(group)
        return
    statements = [_insert_statement(group) for group in groups]
    params = [value for _, group_params in statements for value in group_params]
    if len(statements) == 1:
        sql = statements[0][0]
    else:
        sql = _combined_insert([stmt for stmt, _ in statements], groups)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()  # in the order of VALUES
    pks = [row[0] for row in rows] if len(statements) == 1 else [row[1] for row in rows]
    objs = [obj for group in groups for obj in group]
    for obj, pk in zip(objs, pks, strict=True):
        obj.pk = pk
        obj._state.adding = False
        obj._state.db = connection.alias


_COMBINED_SQL: dict[tuple[str, ...], str] = {}


def _combined_insert(statements: list[str], groups: Sequence[Sequence[models.Model]]) -> str:
    """The groups' INSERTs in one statement, answering (group, pk) in the groups' order; ids
    follow VALUES order within a group (its sequence is drawn row by row)."""
    key = tuple(statements)
    sql = _COMBINED_SQL.get(key)
    if sql is None:
        qn = connection.ops.quote_name
        ctes = ", ".join(f"i{n} AS ({stmt})" for n, stmt in enumerate(statements))
        picks = " UNION ALL ".join(
            f"SELECT {n} AS g, {qn(str(type(g[0])._meta.pk.column))} AS pk FROM i{n}"  # type: ignore[union-attr]  # noqa: S608 - names from _meta
            for n, g in enumerate(groups)
        )
        sql = f"WITH {ctes} SELECT g, pk FROM ({picks}) AS i ORDER BY g, pk"  # noqa: S608
        if len(_COMBINED_SQL) < INSERT_SQL_KEPT:
            _COMBINED_SQL[key] = sql
    return sql


def _insert_statement(objs: Sequence[models.Model]) -> tuple[str, list[Any]]:
    """One model's `INSERT ... VALUES ... RETURNING pk` for `objs`, and its parameters."""
    model = type(objs[0])
    plan = _INSERT_FIELDS.get(model)
    if plan is None:
        plan = [
            (f, f.attname, _plain_type(f)) for f in model._meta.concrete_fields if not f.primary_key
        ]
        _INSERT_FIELDS[model] = plan
    params: list[Any] = []
    nulls: list[bool] = []  # per value: NULL in the statement itself, not a parameter
    for obj in objs:
        values = obj.__dict__
        for field, attname, plain in plan:
            value = _NOT_SET
            if plain is not None:
                value = values.get(attname, _NOT_SET)
                # `is`: True is no int here, and IntegerChoices members become ints; a str
                # subclass (TextChoices) is kept as it is by its preparation too
                if not (
                    value is None
                    or type(value) is plain
                    or (plain is str and isinstance(value, str))
                ):
                    value = _NOT_SET
            if value is _NOT_SET:
                value = field.get_db_prep_save(field.pre_save(obj, True), connection)
            if value is None:
                nulls.append(True)
            else:
                nulls.append(False)
                params.append(value)
    key = (model, tuple(nulls))
    sql = _INSERT_SQL.get(key)
    if sql is None:
        opts, qn = model._meta, connection.ops.quote_name
        width = len(plan)
        rows = (
            "(" + ", ".join("NULL" if null else "%s" for null in nulls[i : i + width]) + ")"
            for i in range(0, len(nulls), width)
        )
        columns = ", ".join(qn(str(f.column)) for f, _, _ in plan)
        sql = (
            f"INSERT INTO {qn(opts.db_table)} ({columns}) "  # noqa: S608 - names from _meta
            f"VALUES {', '.join(rows)} RETURNING {qn(str(opts.pk.column))}"
        )
        if len(_INSERT_SQL) < INSERT_SQL_KEPT:
            _INSERT_SQL[key] = sql
    return sql, params


class EpochSeconds(Func):
    """A datetime as seconds since 1970 (float), computed by the database: reading many rows
    as numbers skips building a datetime object per row."""

    output_field = FloatField()
    arity = 1

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        template = "EXTRACT(EPOCH FROM %(expressions)s)::double precision"
        return self.as_sql(compiler, connection, template=template, **extra)

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        # SQLite stores UTC text; julianday keeps milliseconds
        template = "((julianday(%(expressions)s) - 2440587.5) * 86400.0)"
        return self.as_sql(compiler, connection, template=template, **extra)


class Slot(Expression):
    """A parameter of a `CompiledQuery`, filled in each time the query runs."""

    def __init__(self, name: str) -> None:
        super().__init__(output_field=Field())
        self.name = name

    def as_sql(self, compiler: Any, connection: Any) -> Any:
        return "%s", [self]


class AnyOf(Lookup):  # type: ignore[type-arg]
    """`column` is one of a list of values: `= ANY(array)` on PostgreSQL, one parameter
    whatever the list's length (so a compiled query's SQL does not depend on it); `IN (...)`
    elsewhere. Used as a filter expression: `.filter(AnyOf(F("project_id"), ids))`."""

    lookup_name = "any_of"
    prepare_rhs = False

    def _rhs(self, compiler: Any) -> tuple[str, list[Any]]:
        if hasattr(self.rhs, "as_sql"):
            sql, params = compiler.compile(self.rhs)
            return sql, list(params)
        return "%s", [list(self.rhs)]

    def as_postgresql(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        lhs, lhs_params = self.process_lhs(compiler, connection)
        rhs, rhs_params = self._rhs(compiler)
        array_type = self.lhs.output_field.db_type(connection)
        return f"{lhs} = ANY({rhs}::{array_type}[])", [*lhs_params, *rhs_params]

    def as_sql(self, compiler: Any, connection: Any) -> Any:
        values = list(self.rhs)
        if not values:
            raise EmptyResultSet
        lhs, lhs_params = self.process_lhs(compiler, connection)
        return f"{lhs} IN ({', '.join(['%s'] * len(values))})", [*lhs_params, *values]


RowT = TypeVar("RowT", bound=tuple[Any, ...])


class CompiledQuery(Generic[RowT]):
    """A `values_list` read that Django builds and compiles once, then runs as named rows.

    Building and compiling a queryset costs more CPU than PostgreSQL spends answering a small
    read, and the scheduling cycle runs the same reads back to back (`bench.cycle_scale`).
    `build(**params)` returns the queryset; on PostgreSQL it is built once with a `Slot` for
    each parameter, and every call runs that SQL with the parameters' values in their slots.
    Elsewhere (SQLite, the embedded default) the queryset is built and run each time, as
    Django would. Each row comes back as `row` (a `NamedTuple` whose fields are the selected
    columns, in order; its width is checked against the query's), or a plain tuple without.
    """

    @overload
    def __init__(
        self: CompiledQuery[tuple[Any, ...]], build: Callable[..., QuerySet[Any, Any]]
    ) -> None: ...
    @overload
    def __init__(self, build: Callable[..., QuerySet[Any, Any]], *, row: type[RowT]) -> None: ...
    def __init__(self, build: Callable[..., QuerySet[Any, Any]], *, row: type[Any] = tuple) -> None:
        self._row = row
        self._build = build
        self._compiled: tuple[str, list[Any], list[tuple[int, list[Any], Any]]] | None = None

    def rows(self, **params: Any) -> list[RowT]:
        conn = connections[DEFAULT_DB_ALIAS]
        make: Callable[[Any], RowT] = getattr(self._row, "_make", self._row)
        if conn.vendor != "postgresql":
            return [make(row) for row in self._build(**params)]  # `_make` checks the width
        if self._compiled is None:
            self._compiled = self._compile(conn, list(params))
        sql, template, converters = self._compiled
        values = [params[p.name] if isinstance(p, Slot) else p for p in template]
        with conn.cursor() as cursor:
            cursor.execute(sql, values)
            rows = cursor.fetchall()
        if not converters:
            return [make(row) for row in rows]
        out = []
        for row in rows:
            converted = list(row)
            for pos, convs, expression in converters:
                value = converted[pos]
                for convert in convs:
                    value = convert(value, expression, conn)
                converted[pos] = value
            out.append(make(converted))
        return out

    def _check_width(self, columns: int) -> None:
        fields = getattr(self._row, "_fields", None)
        if fields is not None and columns != len(fields):
            raise TypeError(
                f"{self._row.__name__} names {len(fields)} columns, the query selects {columns}"
            )

    def _compile(
        self, conn: Any, names: list[str]
    ) -> tuple[str, list[Any], list[tuple[int, list[Any], Any]]]:
        queryset = self._build(**{name: Slot(name) for name in names})
        compiler = queryset.query.get_compiler(connection=conn)
        sql, template = compiler.as_sql()
        self._check_width(compiler.col_count)
        select = [s[0] for s in compiler.select[: compiler.col_count]]
        converters = [
            (pos, convs, expression)
            for pos, (convs, expression) in compiler.get_converters(select).items()
        ]
        return sql, list(template), converters


def database_round_trip() -> None:
    """Ask the database server for an answer now (`/readyz`): `SELECT 1` on the default
    connection, replaced first if the server ended it, as in any request. Connections' own
    health checks make no round trip on PostgreSQL (foundation/db_backends/postgresql)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        if cursor.fetchone() != (1,):
            raise RuntimeError("the database did not answer SELECT 1 with 1")
