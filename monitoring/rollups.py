"""Rollups: raw samples → 1-minute rows → 1-hour rows in PostgreSQL, and their retention.

The flush takes one closed minute of raw samples from Redis at a time (renamed under a fresh
token, so appends never race with it), aggregates it in Python and writes it with one bulk
upsert per table. The token is stored in the same transaction: a flush retried after a crash
skips batches already written, so no sample is counted twice.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from foundation.locks import redis_client
from monitoring import live
from monitoring.models import (
    Alert,
    ClusterRollup,
    FleetSnapshot,
    GpuRollup,
    Notification,
    Resolution,
    RollupFlush,
)
from scheduler.core.periods import floor_hour
from scheduler.models import Gpu

READ_CHUNK = 50_000
# accumulator slots: share, n, idle, usum, umax, msum, mn, mmax, tsum, tn, tmax, psum, pn, pmax
Acc = list[float]
GpuRows = dict[tuple[int, int], Acc]
ClusterRows = dict[str, list[float]]  # model → [samples, held_samples, util_sum]

GPU_COLUMNS = (
    "share_milli",
    "samples",
    "idle_samples",
    "util_avg",
    "util_max",
    "mem_avg",
    "mem_max",
    "temp_avg",
    "temp_max",
    "power_avg",
    "power_max",
)


def minute_start(minute: int) -> datetime:
    return datetime.fromtimestamp(minute * 60, tz=UTC)


def _lines(entries: Iterable[bytes | str]) -> Iterable[str]:
    """Sample lines of raw entries (one entry holds one heartbeat's lines of one minute)."""
    for raw in entries:
        yield from (raw.decode() if isinstance(raw, bytes) else raw).split("\n")


def aggregate(entries: Iterable[bytes | str]) -> tuple[GpuRows, ClusterRows]:
    """Per (GPU, job) accumulators and per-model fleet counters of raw sample lines."""
    idle_below = float(settings.MONITORING_IDLE_UTIL_PCT)
    rows: GpuRows = {}
    cluster: ClusterRows = {}
    for text in _lines(entries):
        gpu_s, model, job_s, share_s, first, util_s, mem_s, temp_s, power_s = text.split(",")
        gpu, job = int(gpu_s), int(job_s)
        util = float(util_s)
        acc = rows.get((gpu, job))
        if acc is None:
            acc = rows[(gpu, job)] = [
                float(share_s),
                0,
                0,
                0.0,
                0.0,
                0.0,
                0,
                0.0,
                0.0,
                0,
                0.0,
                0.0,
                0,
                0.0,
            ]
        acc[1] += 1
        if util < idle_below:
            acc[2] += 1
        acc[3] += util
        if util > acc[4]:
            acc[4] = util
        # memory, temperature, power: (sum, count, max) at 5, 8 and 11; a blank is no reading
        for raw, at in ((mem_s, 5), (temp_s, 8), (power_s, 11)):
            if raw:
                v = float(raw)
                acc[at] += v
                acc[at + 1] += 1
                if v > acc[at + 2]:
                    acc[at + 2] = v
        if first != "1":
            continue  # a shared GPU has one line per holder: count the device once for the fleet
        c = cluster.get(model)
        if c is None:
            c = cluster[model] = [0, 0, 0.0]
        c[0] += 1
        if job:
            c[1] += 1
        c[2] += util
    return rows, cluster


def _gpu_values(rows: GpuRows) -> list[list[Any]]:
    cols: list[list[Any]] = [[] for _ in range(13)]
    for (gpu, job), a in rows.items():
        n = a[1]
        values = (
            gpu,
            job,
            int(a[0]),
            int(n),
            int(a[2]),
            a[3] / n,
            a[4],
            a[5] / a[6] if a[6] else 0.0,
            a[7],
            a[8] / a[9] if a[9] else 0.0,
            a[10],
            a[11] / a[12] if a[12] else 0.0,
            a[13],
        )
        for col, v in zip(cols, values, strict=True):
            col.append(v)
    return cols


def _greatest() -> str:
    return "GREATEST" if connection.vendor == "postgresql" else "MAX"


def _merge_set(columns: Sequence[str], maxima: Sequence[str], avgs: Sequence[str]) -> str:
    """ON CONFLICT assignments that add samples and weight averages by them."""
    g = _greatest()
    parts = []
    for c in avgs:
        parts.append(
            f"{c} = (t.{c} * t.samples + EXCLUDED.{c} * EXCLUDED.samples)"
            " / (t.samples + EXCLUDED.samples)"
        )
    for c in maxima:
        parts.append(f"{c} = {g}(t.{c}, EXCLUDED.{c})")
    for c in columns:
        parts.append(f"{c} = t.{c} + EXCLUDED.{c}")
    return ", ".join(parts)


def upsert_minute(minute: int, rows: GpuRows, cluster: ClusterRows, *, replace: bool) -> None:
    """Write one minute's accumulators: one statement per table (merge with what is there)."""
    bucket = minute_start(minute)
    g_table, c_table = GpuRollup._meta.db_table, ClusterRollup._meta.db_table
    cols = _gpu_values(rows)
    gpu_set = _merge_set(
        ["samples", "idle_samples"],
        ["util_max", "mem_max", "temp_max", "power_max", "share_milli"],
        ["util_avg", "mem_avg", "temp_avg", "power_avg"],
    )
    if replace:
        gpu_set = ", ".join(f"{c} = EXCLUDED.{c}" for c in GPU_COLUMNS)
    insert_cols = "resolution, bucket, gpu_id, held_by_job, " + ", ".join(GPU_COLUMNS)
    conflict = "(resolution, gpu_id, held_by_job, bucket)"
    c_rows = [(model, int(n), int(h), u / n) for model, (n, h, u) in cluster.items() if n]
    c_set = _merge_set(["samples", "held_samples"], [], ["util_avg"])
    # Fast path (raw SQL, `bench.telemetry_ingest`): upserts that add to the stored row, which
    # `bulk_create(update_conflicts=...)` cannot (it only overwrites).
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            if rows:
                cursor.execute(
                    f"INSERT INTO {g_table} AS t ({insert_cols}) "  # noqa: S608 (table names from _meta)
                    "SELECT %s, %s, u.* FROM unnest(%s::bigint[], %s::bigint[], %s::int[], "
                    "%s::int[], %s::int[], %s::float8[], %s::float8[], %s::float8[], "
                    "%s::float8[], %s::float8[], %s::float8[], %s::float8[], %s::float8[]) "
                    f"AS u(gpu_id, held_by_job, {', '.join(GPU_COLUMNS)}) "
                    # A GPU deleted since its samples arrived (a node removed by hand) must
                    # not make the whole minute fail on the foreign key, again and again.
                    f"WHERE EXISTS (SELECT 1 FROM {Gpu._meta.db_table} g WHERE g.id = u.gpu_id) "
                    f"ON CONFLICT {conflict} DO UPDATE SET {gpu_set}",
                    [Resolution.MINUTE, bucket, *cols],
                )
            if c_rows:
                cursor.execute(
                    f"INSERT INTO {c_table} AS t "  # noqa: S608 (table names from _meta)
                    "(resolution, bucket, model_name, samples, held_samples, util_avg) "
                    "SELECT %s, %s, * FROM unnest(%s::text[], %s::int[], %s::int[], %s::float8[]) "
                    f"ON CONFLICT (resolution, model_name, bucket) DO UPDATE SET {c_set}",
                    [Resolution.MINUTE, bucket, *map(list, zip(*c_rows, strict=True))],
                )
            return
        marks = ", ".join(["%s"] * (len(GPU_COLUMNS) + 4))
        if rows:
            cursor.executemany(
                f"INSERT INTO {g_table} AS t ({insert_cols}) VALUES ({marks}) "  # noqa: S608 (table names from _meta)
                f"ON CONFLICT {conflict} DO UPDATE SET {gpu_set}",
                [[Resolution.MINUTE, bucket, *row] for row in zip(*cols, strict=True)],
            )
        if c_rows:
            cursor.executemany(
                f"INSERT INTO {c_table} AS t "  # noqa: S608 (table names from _meta)
                "(resolution, bucket, model_name, samples, held_samples, util_avg) "
                "VALUES (%s, %s, %s, %s, %s, %s) "
                f"ON CONFLICT (resolution, model_name, bucket) DO UPDATE SET {c_set}",
                [[Resolution.MINUTE, bucket, *row] for row in c_rows],
            )


def _process(token: str) -> int:
    """Write one renamed batch of raw samples unless its token says it was written already."""
    client = redis_client()
    proc = live.key("proc", token)
    minute = int(token.split(":", 1)[0])
    if RollupFlush.objects.filter(token=token).exists():
        client.delete(proc)
        client.srem(live.key("proc-set"), token)
        return 0
    entries: list[bytes | str] = []
    start = 0
    while True:
        chunk = client.lrange(proc, start, start + READ_CHUNK - 1)
        entries.extend(chunk)
        if len(chunk) < READ_CHUNK:
            break
        start += READ_CHUNK
    samples = sum(live.text(e).count("\n") + 1 for e in entries)
    if entries:
        rows, cluster = aggregate(entries)
        with transaction.atomic():
            RollupFlush.objects.create(token=token, bucket=minute_start(minute), samples=samples)
            upsert_minute(minute, rows, cluster, replace=False)
    client.delete(proc)
    client.srem(live.key("proc-set"), token)
    return samples


def flush_rollups(*, now: datetime) -> int:
    """Turn every closed minute of raw samples into 1-minute rollups. Returns samples written."""
    if not live.use_redis():
        return 0  # the embedded default merges samples at ingest
    client = redis_client()
    written = 0
    for leftover in sorted(live.text(m) for m in client.smembers(live.key("proc-set"))):
        written += _process(leftover)  # a previous flush died midway
    grace = int(settings.MONITORING_FLUSH_GRACE_S)
    minutes = sorted(int(m) for m in client.smembers(live.key("raw-minutes")))
    for minute in minutes:
        if (minute + 1) * 60 + grace > now.timestamp():
            continue
        token = f"{minute}:{secrets.token_hex(6)}"
        pipe = client.pipeline(transaction=True)
        pipe.srem(live.key("raw-minutes"), minute)
        pipe.rename(live.key("raw", minute), live.key("proc", token))
        pipe.sadd(live.key("proc-set"), token)
        results = pipe.execute(raise_on_error=False)
        if isinstance(results[1], Exception):  # nothing was queued for that minute
            client.srem(live.key("proc-set"), token)
            continue
        written += _process(token)
    return written


def rollup_hours(*, now: datetime) -> int:
    """Recompute the 1-hour rows of the previous and the current hour from 1-minute rows.

    Replaces what is there, so running it again (or late) gives the same rows.
    """
    g_table, c_table = GpuRollup._meta.db_table, ClusterRollup._meta.db_table
    total = 0
    current = floor_hour(now)
    for start in (current - timedelta(hours=1), current):
        end = start + timedelta(hours=1)
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {g_table} AS t (resolution, bucket, gpu_id, held_by_job, "
                + ", ".join(GPU_COLUMNS)
                + ") SELECT %s, %s, gpu_id, held_by_job, MAX(share_milli), SUM(samples), "  # noqa: S608 (table names from _meta)
                "SUM(idle_samples), SUM(util_avg * samples) / SUM(samples), MAX(util_max), "
                "SUM(mem_avg * samples) / SUM(samples), MAX(mem_max), "
                "SUM(temp_avg * samples) / SUM(samples), MAX(temp_max), "
                "SUM(power_avg * samples) / SUM(samples), MAX(power_max) "
                f"FROM {g_table} WHERE resolution = %s AND bucket >= %s AND bucket < %s "
                "GROUP BY gpu_id, held_by_job "
                "ON CONFLICT (resolution, gpu_id, held_by_job, bucket) DO UPDATE SET "
                + ", ".join(f"{c} = EXCLUDED.{c}" for c in GPU_COLUMNS),
                [Resolution.HOUR, start, Resolution.MINUTE, start, end],
            )
            total += cursor.rowcount
            cursor.execute(
                f"INSERT INTO {c_table} AS t (resolution, bucket, model_name, samples, "  # noqa: S608 (table names from _meta)
                "held_samples, util_avg) SELECT %s, %s, model_name, SUM(samples), "
                "SUM(held_samples), SUM(util_avg * samples) / SUM(samples) "
                f"FROM {c_table} WHERE resolution = %s AND bucket >= %s AND bucket < %s "
                "GROUP BY model_name ON CONFLICT (resolution, model_name, bucket) DO UPDATE SET "
                "samples = EXCLUDED.samples, held_samples = EXCLUDED.held_samples, "
                "util_avg = EXCLUDED.util_avg",
                [Resolution.HOUR, start, Resolution.MINUTE, start, end],
            )
    return total


def enforce_retention(*, now: datetime) -> dict[str, int]:
    """Delete rollups, snapshots and closed alerts older than their retention periods."""
    days = settings.MONITORING_MINUTE_RETENTION_DAYS
    minute_cut = now - timedelta(days=days)
    hour_cut = now - timedelta(days=settings.MONITORING_HOUR_RETENTION_DAYS)
    out = {}
    for name, model in (("gpu", GpuRollup), ("cluster", ClusterRollup)):
        qs = model.objects
        out[f"{name}_1m"] = qs.filter(resolution=Resolution.MINUTE, bucket__lt=minute_cut).delete()[
            0
        ]
        out[f"{name}_1h"] = qs.filter(resolution=Resolution.HOUR, bucket__lt=hour_cut).delete()[0]
    snap_cut = now - timedelta(days=settings.MONITORING_SNAPSHOT_RETENTION_DAYS)
    out["snapshots"] = FleetSnapshot.objects.filter(at__lt=snap_cut).delete()[0]
    out["flushes"] = RollupFlush.objects.filter(
        created_at__lt=now - timedelta(days=max(days, 1))
    ).delete()[0]
    alert_cut = now - timedelta(days=settings.MONITORING_ALERT_RETENTION_DAYS)
    out["alerts"] = Alert.objects.filter(resolved_at__lt=alert_cut).delete()[0]
    out["notifications"] = Notification.objects.filter(
        read_at__lt=alert_cut, alert__isnull=True
    ).delete()[0]
    return out
