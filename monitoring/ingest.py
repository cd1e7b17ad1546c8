"""Telemetry ingest: the sink every heartbeat calls (`SCHEDULER_TELEMETRY_SINKS`).

Per heartbeat: one SQL query finds which job (and share) holds each GPU of the node right now,
then one Redis pipeline stores the latest values, appends to each GPU's live window, queues the
raw samples for the minute rollup and bumps the fleet counters. Nothing here runs per sample
against the database.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.db import connection

from monitoring import live
from scheduler.models import Allocation, Gpu, GpuModel, Node

Holders = dict[int, tuple[str, list[tuple[int, int]]]]  # gpu_id → (model name, [(job, share)])


def holders_of(node_id: int) -> Holders:
    """Each GPU of the node with its model and the jobs holding a share of it now (one query)."""
    gpu_t, model_t, alloc_t = (m._meta.db_table for m in (Gpu, GpuModel, Allocation))
    sql = (
        f"SELECT g.id, m.name, a.job_id, a.share_milli FROM {gpu_t} g "  # noqa: S608 (table names from _meta)
        f"JOIN {model_t} m ON m.id = g.model_id "
        f"LEFT JOIN {alloc_t} a ON a.gpu_id = g.id AND a.ended_at IS NULL "
        "WHERE g.node_id = %s"
    )
    out: Holders = {}
    with connection.cursor() as cursor:
        cursor.execute(sql, [node_id])
        for gpu_id, model, job_id, share in cursor.fetchall():
            entry = out.setdefault(gpu_id, (model, []))
            if job_id is not None:
                entry[1].append((job_id, share))
    return out


def build_batch(
    *, node_id: int, samples: list[dict[str, Any]], holders: Holders, now: datetime
) -> live.Batch:
    """The Redis writes of one heartbeat, each sample attributed to the jobs holding its GPU."""
    now_ts = now.timestamp()
    at = now.isoformat()
    batch = live.Batch(now_ts=now_ts, node_id=node_id)
    fmt = live.fmt
    for s in samples:
        gpu_id = int(s["gpu_id"])
        found = holders.get(gpu_id)
        if found is None:
            continue  # not this node's GPU (reassigned between the heartbeat and now)
        model, held = found
        util = s.get("utilization")
        mem, temp, power = s.get("memory_used_mib"), s.get("temperature_c"), s.get("power_w")
        job_ids = [job for job, _share in held]
        batch.latest[gpu_id] = json.dumps(
            {**s, "at": at, "at_ts": now_ts, "job_ids": job_ids, "model": model},
            separators=(",", ":"),
        )
        batch.utils[gpu_id] = f"{fmt(util)},{now_ts:.0f}"
        metrics = f"{fmt(util)},{fmt(mem)},{fmt(temp)},{fmt(power)}"
        batch.points[gpu_id] = f"{gpu_id},{metrics},{job_ids[0] if len(job_ids) == 1 else 0}"
        if util is not None:
            for i, (job, share) in enumerate(held or [(0, 0)]):
                batch.raw.append(f"{gpu_id},{model},{job},{share},{int(i == 0)},{metrics}")
        batch.count(model, util, bool(held))
        xids = s.get("xid_events") or []
        if xids:
            batch.xids[gpu_id] = f"{int(xids[-1])},{now_ts:.0f}"
    return batch


def ingest_samples(*, node: Node, samples: list[dict[str, Any]], now: datetime) -> None:
    """The telemetry sink: attribute, then write live values and raw samples in one round trip."""
    if not samples:
        return
    batch = build_batch(node_id=node.pk, samples=samples, holders=holders_of(node.pk), now=now)
    live.write(batch)
    if not live.use_redis() and batch.raw:
        # Embedded default: no Redis to queue raw samples in, so merge them into the rollup now.
        from monitoring.rollups import aggregate, upsert_minute

        minute = int(batch.now_ts // 60)
        rows, cluster = aggregate(batch.raw)
        upsert_minute(minute, rows, cluster, replace=False)
