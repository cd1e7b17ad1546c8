"""Telemetry ingest: the sink every heartbeat calls (`scheduler.ports.TELEMETRY_SINKS`).

A heartbeat carries one or more samples per GPU; each sample says how old it is (`age_s`,
relative to the heartbeat, so agents' clocks do not matter) and lands at its own instant.

Attribution: each sample goes to the job(s) whose allocation interval on its GPU contains the
sample's instant. The intervals of a node (active ones and those ended in the last
`HORIZON_S`) are cached per process and tagged with the node's allocation generation, a Redis
counter bumped whenever an allocation on the node starts or ends (`allocations_changed`, the
scheduler's transitions call it through their allocation-listener port). The write is one Redis
script that checks the generation first: unchanged, it writes; changed, nothing is written and
the sink re-reads the intervals (one SQL query) and writes again. So a steady heartbeat costs one Redis
round trip and no SQL, and no sample is attributed from stale intervals.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from django.db import connection, transaction

from monitoring import live
from scheduler.models import Allocation, Gpu, GpuModel, Node

HORIZON_S = 900.0  # intervals ended this long ago still attribute late samples of a batch
MAX_AGE_S = 300.0  # a cached node is re-read at least this often, whatever the generation
OPEN_END = float("inf")

Span = tuple[int, int, float, float]  # job, share, start ts, end ts (inf while active)


@dataclass(frozen=True, slots=True)
class NodeHolders:
    """A node's GPUs (gpu_id → model) and allocation intervals (gpu_id → spans) since `since_ts`."""

    models: dict[int, str]
    spans: dict[int, list[Span]]
    since_ts: float
    generation: str
    fetched_at: float

    def at(self, gpu_id: int, ts: float) -> list[tuple[int, int]]:
        """(job, share) of every allocation holding the GPU at instant `ts`."""
        return [(job, share) for job, share, a, b in self.spans.get(gpu_id, ()) if a <= ts < b]


_cache: dict[tuple[str, int], NodeHolders] = {}
stats = {"reads": 0}  # interval reads from the database by this process (the benchmark reports it)


def holders_of(node_id: int, *, since_ts: float, generation: str = "0") -> NodeHolders:
    """The node's GPUs with their models and allocations active at or after `since_ts` (one query)."""
    gpu_t, model_t, alloc_t = (m._meta.db_table for m in (Gpu, GpuModel, Allocation))
    sql = (
        "SELECT g.id, m.name, a.job_id, a.share_milli, "  # noqa: S608 (table names from _meta)
        "EXTRACT(EPOCH FROM a.started_at), EXTRACT(EPOCH FROM a.ended_at) "
        f"FROM {gpu_t} g JOIN {model_t} m ON m.id = g.model_id "
        f"LEFT JOIN {alloc_t} a ON a.gpu_id = g.id AND (a.ended_at IS NULL OR a.ended_at > %s) "
        "WHERE g.node_id = %s"
    )
    if connection.vendor != "postgresql":
        sql = sql.replace("EXTRACT(EPOCH FROM a.started_at)", "a.started_at").replace(
            "EXTRACT(EPOCH FROM a.ended_at)", "a.ended_at"
        )
    models: dict[int, str] = {}
    spans: dict[int, list[Span]] = {}
    # Fast path (raw SQL, `bench.telemetry_ingest`): a node's GPUs and their holders in one read.
    with connection.cursor() as cursor:
        cursor.execute(sql, [datetime.fromtimestamp(since_ts, tz=UTC), node_id])
        for gpu_id, model, job_id, share, start, end in cursor.fetchall():
            models[gpu_id] = model
            if job_id is not None:
                spans.setdefault(gpu_id, []).append(
                    (job_id, share, _epoch(start), OPEN_END if end is None else _epoch(end))
                )
    return NodeHolders(models, spans, since_ts, generation, time.monotonic())


def _epoch(value: Any) -> float:
    return value.timestamp() if isinstance(value, datetime) else float(value)


def _cached(node_id: int, oldest_ts: float) -> NodeHolders | None:
    entry = _cache.get((live.prefix(), node_id))
    if entry is None or entry.since_ts > oldest_ts:
        return None
    if time.monotonic() - entry.fetched_at > MAX_AGE_S:
        return None
    return entry


def _fetch(node_id: int, *, generation: str, oldest_ts: float, now_ts: float) -> NodeHolders:
    entry = holders_of(node_id, since_ts=min(oldest_ts, now_ts - HORIZON_S), generation=generation)
    stats["reads"] += 1
    if len(_cache) > 50_000:
        _cache.clear()
    _cache[(live.prefix(), node_id)] = entry
    return entry


def allocations_changed(*, node_ids: Iterable[int]) -> None:
    """Listener (`scheduler.ports.ALLOCATION_LISTENERS`): allocations on these nodes started or ended.

    Bumped now (this transaction's own heartbeats see it) and again after commit (other
    processes that re-read the intervals before the commit read them once more).
    """
    ids = set(node_ids)
    if not ids:
        return
    live.bump_generations(ids)
    transaction.on_commit(lambda: live.bump_generations(ids))


def _sample_ts(sample: dict[str, Any], now_ts: float) -> float:
    age = sample.get("age_s") or 0.0
    return now_ts - max(0.0, float(age))


def build_batch(
    *, node_id: int, samples: list[dict[str, Any]], holders: NodeHolders, now: datetime
) -> live.Batch:
    """The Redis writes of one heartbeat, each sample attributed at its own instant."""
    now_ts = now.timestamp()
    batch = live.Batch(now_ts=now_ts, node_id=node_id)
    fmt = live.fmt
    newest: dict[int, tuple[float, dict[str, Any], list[int], str]] = {}
    for s in samples:
        gpu_id = int(s["gpu_id"])
        model = holders.models.get(gpu_id)
        if model is None:
            continue  # not this node's GPU (reassigned between the heartbeat and now)
        ts = _sample_ts(s, now_ts)
        held = holders.at(gpu_id, ts)
        util = s.get("utilization")
        metrics = (
            f"{fmt(util)},{fmt(s.get('memory_used_mib'))},"
            f"{fmt(s.get('temperature_c'))},{fmt(s.get('power_w'))}"
        )
        job_ids = [job for job, _share in held]
        batch.jobs.update(job_ids)
        seen = newest.get(gpu_id)
        if seen is None or ts >= seen[0]:
            newest[gpu_id] = (ts, s, job_ids, model)
        slice_ = batch.slices.get(ts)
        if slice_ is None:
            slice_ = batch.slices[ts] = []
        slice_.append(f"{gpu_id},{metrics},{job_ids[0] if len(job_ids) == 1 else 0}")
        if util is not None:
            minute = int(ts // 60)
            lines = batch.raw.get(minute)
            if lines is None:
                lines = batch.raw[minute] = []
            if held:
                for i, (job, share) in enumerate(held):
                    lines.append(f"{gpu_id},{model},{job},{share},{int(i == 0)},{metrics}")
            else:
                lines.append(f"{gpu_id},{model},0,0,1,{metrics}")
        batch.count(ts, model, util, bool(held))
        xids = s.get("xid_events") or []
        if xids:
            batch.xids[gpu_id] = f"{int(xids[-1])},{ts:.0f}"
    for gpu_id, (ts, s, job_ids, model) in newest.items():
        doc = {**s, "at": datetime.fromtimestamp(ts, tz=now.tzinfo).isoformat(), "at_ts": ts}
        doc.pop("age_s", None)
        doc["job_ids"], doc["model"] = job_ids, model
        batch.latest[gpu_id] = orjson.dumps(doc).decode()
        batch.utils[gpu_id] = f"{fmt(s.get('utilization'))},{ts:.0f}"
    return batch


def ingest_samples(*, node: Node, samples: list[dict[str, Any]], now: datetime) -> None:
    """The telemetry sink: attribute each sample at its instant, then write it all in one go."""
    if not samples:
        return
    now_ts = now.timestamp()
    oldest = min(_sample_ts(s, now_ts) for s in samples)
    if not live.use_redis():  # embedded default: no generation to trust, read every time
        holders = holders_of(node.pk, since_ts=min(oldest, now_ts - HORIZON_S))
        batch = build_batch(node_id=node.pk, samples=samples, holders=holders, now=now)
        live.write(batch)
        _merge_now(batch)
        return
    holders_or_none = _cached(node.pk, oldest)
    if holders_or_none is None:
        holders_or_none = _fetch(
            node.pk, generation=live.generation(node.pk), oldest_ts=oldest, now_ts=now_ts
        )
    holders = holders_or_none
    for _attempt in range(3):
        batch = build_batch(node_id=node.pk, samples=samples, holders=holders, now=now)
        current = live.write(batch, generation=holders.generation)
        if current is None:
            return
        holders = _fetch(node.pk, generation=current, oldest_ts=oldest, now_ts=now_ts)
    # Allocations on this node keep changing under us: write what the database says now.
    holders = _fetch(node.pk, generation="*", oldest_ts=oldest, now_ts=now_ts)
    _cache.pop((live.prefix(), node.pk), None)
    live.write(build_batch(node_id=node.pk, samples=samples, holders=holders, now=now))


def _merge_now(batch: live.Batch) -> None:
    """Embedded default: no Redis to queue raw samples in, so merge them into the rollups now."""
    from monitoring.rollups import aggregate, upsert_minute

    for minute, lines in batch.raw.items():
        rows, cluster = aggregate(lines)
        upsert_minute(minute, rows, cluster, replace=False)
