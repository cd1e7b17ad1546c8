"""Database helpers for hot paths."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connection, models


def bulk_update_fast(
    model: type[models.Model], objs: Sequence[models.Model], fields: Sequence[str]
) -> int:
    """Update `fields` of many model instances in one statement (see `bulk_update_rows`)."""
    if not objs:
        return 0
    if connection.vendor != "postgresql":
        updated: int = model._default_manager.bulk_update(objs, fields, batch_size=500)
        return updated
    cols = _columns(model, fields)
    rows = [(obj.pk, *(getattr(obj, c.attname) for c in cols)) for obj in objs]
    return bulk_update_rows(model, fields, rows)


def _columns(model: type[models.Model], fields: Sequence[str]) -> list[models.Field[Any, Any]]:
    cols = [f for f in (model._meta.get_field(n) for n in fields) if isinstance(f, models.Field)]
    if len(cols) != len(fields):
        raise ValueError("bulk updates change concrete fields only")
    return cols


def bulk_update_rows(
    model: type[models.Model], fields: Sequence[str], rows: Sequence[tuple[Any, ...]]
) -> int:
    """Update many rows given as `(pk, value, ...)` tuples, without building model instances.

    On PostgreSQL this is `UPDATE ... FROM (VALUES ...)`, which stays fast for thousands of rows
    where Django's `bulk_update` builds a CASE per field; elsewhere it falls back to it.
    """
    if not rows:
        return 0
    cols = _columns(model, fields)
    if connection.vendor != "postgresql":
        objs = [model(pk=row[0], **dict(zip(fields, row[1:], strict=True))) for row in rows]
        updated: int = model._default_manager.bulk_update(objs, fields, batch_size=500)
        return updated
    pk = model._meta.pk
    assert pk is not None and pk.column is not None
    table = connection.ops.quote_name(model._meta.db_table)
    casts = [pk.db_type(connection)] + [c.db_type(connection) for c in cols]
    names = ["id_", *[f"c{i}" for i in range(len(cols))]]
    assignments = ", ".join(
        f"{connection.ops.quote_name(str(c.column))} = v.c{i}::{casts[i + 1]}"
        for i, c in enumerate(cols)
    )
    # Identifiers come from the model's metadata and values are parameters.
    where = f"t.{connection.ops.quote_name(pk.column)} = v.id_::{casts[0]}"
    total = 0
    for start in range(0, len(rows), 2000):
        chunk = rows[start : start + 2000]
        params: list[Any] = []
        for row in chunk:
            params.append(pk.get_db_prep_value(row[0], connection))
            params += [
                c.get_db_prep_save(v, connection) for c, v in zip(cols, row[1:], strict=True)
            ]
        placeholder = "(" + ", ".join(["%s"] * (len(cols) + 1)) + ")"
        values_sql = ", ".join([placeholder] * len(chunk))
        sql = f"UPDATE {table} AS t SET {assignments} FROM (VALUES {values_sql}) AS v({', '.join(names)}) WHERE {where}"  # noqa: S608
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            total += cursor.rowcount
    return total
