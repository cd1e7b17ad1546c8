"""Database helpers for hot paths."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connection, models


def bulk_update_fast(
    model: type[models.Model], objs: Sequence[models.Model], fields: Sequence[str]
) -> int:
    """Update `fields` of many rows in one statement.

    On PostgreSQL this is `UPDATE ... FROM (VALUES ...)`, which stays fast for thousands of rows
    where Django's `bulk_update` builds a CASE per field; elsewhere it falls back to it.
    """
    if not objs:
        return 0
    if connection.vendor != "postgresql":
        updated: int = model._default_manager.bulk_update(objs, fields, batch_size=500)
        return updated
    meta = model._meta
    cols = [f for f in (meta.get_field(name) for name in fields) if isinstance(f, models.Field)]
    if len(cols) != len(fields):
        raise ValueError("bulk_update_fast updates concrete fields only")
    pk = meta.pk
    assert pk is not None and pk.column is not None
    table = connection.ops.quote_name(meta.db_table)
    total = 0
    for start in range(0, len(objs), 2000):
        chunk = objs[start : start + 2000]
        params: list[Any] = []
        rows = []
        for obj in chunk:
            values = [pk.get_db_prep_value(obj.pk, connection)]
            values += [c.get_db_prep_save(getattr(obj, c.attname), connection) for c in cols]
            params += values
            rows.append("(" + ", ".join(["%s"] * len(values)) + ")")
        casts = [pk.db_type(connection)] + [c.db_type(connection) for c in cols]
        names = ["id_", *[f"c{i}" for i in range(len(cols))]]
        assignments = ", ".join(
            f"{connection.ops.quote_name(str(c.column))} = v.c{i}::{casts[i + 1]}"
            for i, c in enumerate(cols)
        )
        # Identifiers come from the model's metadata and values are parameters.
        where = f"t.{connection.ops.quote_name(pk.column)} = v.id_::{casts[0]}"
        values_sql = ", ".join(rows)
        sql = f"UPDATE {table} AS t SET {assignments} FROM (VALUES {values_sql}) AS v({', '.join(names)}) WHERE {where}"  # noqa: S608
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            total += cursor.rowcount
    return total
