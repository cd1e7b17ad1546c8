"""The live telemetry store: the latest sample and a short window per GPU, in Redis.

Keys (prefix `settings.MONITORING_KEY_PREFIX`, "mon" by default):

- `mon:latest`            hash gpu_id → JSON of its latest sample (with `at_ts`, `job_ids`), and
                          "u<gpu_id>" → "utilization,ts" for the heatmap;
                          readers drop samples older than MONITORING_LATEST_TTL_S;
- `mon:win:<node_id>`     list of heartbeats "ts;gpu,util,mem,temp,power,job;gpu,...", capped
                          at MONITORING_LIVE_POINTS, expires with the window;
- `mon:raw:<minute>`      raw samples of one minute, waiting for the rollup flush;
- `mon:raw-minutes`       set of minutes with raw samples; `mon:proc-set` batches being flushed;
- `mon:cl:<10 s bucket>`  hash of fleet counters per GPU model (n, util sum, held) for live charts;
- `mon:lastxid`           hash gpu_id → "xid,ts" of the last XID each GPU reported.

One heartbeat is about ten Redis commands in one pipeline, whatever the number of GPUs.
Without Redis (the embedded default) the same reads and writes go to the Django cache, which is
good enough for a one-laptop demo and not meant for a fleet.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.cache import cache

from portal.locks import redis_client

CLUSTER_STEP_S = 10


def prefix() -> str:
    return str(settings.MONITORING_KEY_PREFIX)


def key(*parts: object) -> str:
    return ":".join([prefix(), *(str(p) for p in parts)])


def use_redis() -> bool:
    return bool(settings.REDIS_URL)


@dataclass(frozen=True, slots=True)
class Point:
    ts: float
    util: float | None
    mem: float | None
    temp: float | None
    power: float | None
    job: int


def _num(raw: str) -> float | None:
    return float(raw) if raw else None


def text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def parse_point(raw: bytes | str) -> Point:
    text_ = text(raw)
    ts, util, mem, temp, power, job = text_.split(",")
    return Point(float(ts), _num(util), _num(mem), _num(temp), _num(power), int(job or 0))


def fmt(value: float | int | None) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.2f}".rstrip("0")
    return str(int(value))


@dataclass
class Batch:
    """Everything one heartbeat writes, gathered so it goes to Redis in one round trip."""

    now_ts: float
    node_id: int = 0
    latest: dict[int, str] = field(default_factory=dict)  # gpu_id → JSON
    utils: dict[int, str] = field(default_factory=dict)  # gpu_id → "util,ts" (for the heatmap)
    points: dict[int, str] = field(default_factory=dict)  # gpu_id → "gpu,util,mem,temp,power,job"
    raw: list[str] = field(default_factory=list)
    cluster: dict[str, float] = field(default_factory=dict)
    xids: dict[int, str] = field(default_factory=dict)

    def count(self, model: str, util: float | None, held: bool) -> None:
        if util is None:
            return
        c = self.cluster
        c[f"n:{model}"] = c.get(f"n:{model}", 0) + 1
        c[f"u:{model}"] = c.get(f"u:{model}", 0.0) + util
        if held:
            c[f"h:{model}"] = c.get(f"h:{model}", 0) + 1


_queued_minutes: set[str] = set()  # raw keys this process already gave an expiry


def write(batch: Batch) -> None:
    """One pipeline: latest, window append and trim, raw samples, fleet counters, XIDs."""
    minute = int(batch.now_ts // 60)
    cl_bucket = int(batch.now_ts // CLUSTER_STEP_S) * CLUSTER_STEP_S
    window_s = int(settings.MONITORING_LIVE_WINDOW_S)
    points = int(settings.MONITORING_LIVE_POINTS)
    entry = f"{batch.now_ts:.3f};" + ";".join(batch.points.values()) if batch.points else ""
    if not use_redis():
        _cache_write(batch, entry, window_s, points, cl_bucket)
        return
    pipe = redis_client().pipeline(transaction=False)
    if batch.latest:
        pipe.hset(
            key("latest"),
            mapping={
                **{str(k): v for k, v in batch.latest.items()},
                **{f"u{k}": v for k, v in batch.utils.items()},
            },
        )
    if entry:
        wkey = key("win", batch.node_id)
        pipe.rpush(wkey, entry)
        pipe.ltrim(wkey, -points, -1)
        pipe.expire(wkey, window_s)
    if batch.raw:
        rkey = key("raw", minute)
        pipe.rpush(rkey, *batch.raw)
        pipe.sadd(key("raw-minutes"), minute)  # every time: a flush may have taken the minute
        if rkey not in _queued_minutes:  # a safety expiry, once per minute and process
            pipe.expire(rkey, 86_400)
            if len(_queued_minutes) > 1000:
                _queued_minutes.clear()
            _queued_minutes.add(rkey)
    if batch.cluster:
        ckey = key("cl", cl_bucket)
        for name, value in batch.cluster.items():
            if name.startswith("u:"):
                pipe.hincrbyfloat(ckey, name, value)
            else:
                pipe.hincrby(ckey, name, int(value))
        pipe.expire(ckey, window_s + 120)
    if batch.xids:
        pipe.hset(key("lastxid"), mapping={str(k): v for k, v in batch.xids.items()})
    pipe.execute()


def _cache_write(batch: Batch, entry: str, window_s: int, points: int, cl_bucket: int) -> None:
    """The embedded default: read-modify-write through the Django cache (one process, demo scale)."""
    latest_all = cache.get(key("latest"), {})
    latest_all.update({str(k): v for k, v in batch.latest.items()})
    latest_all.update({f"u{k}": v for k, v in batch.utils.items()})
    cache.set(key("latest"), latest_all, timeout=None)
    if entry:
        wkey = key("win", batch.node_id)
        cache.set(wkey, [*cache.get(wkey, []), entry][-points:], timeout=window_s)
    ckey = key("cl", cl_bucket)
    counters = cache.get(ckey, {})
    for name, value in batch.cluster.items():
        counters[name] = counters.get(name, 0) + value
    cache.set(ckey, counters, timeout=window_s + 120)
    if batch.xids:
        xids = cache.get(key("lastxid"), {})
        xids.update({str(k): v for k, v in batch.xids.items()})
        cache.set(key("lastxid"), xids, timeout=None)


def latest(gpu_ids: Iterable[int], *, now_ts: float | None = None) -> dict[int, dict[str, Any]]:
    """The latest sample per GPU that reported within MONITORING_LATEST_TTL_S."""
    ids = list(gpu_ids)
    if not ids:
        return {}
    if use_redis():
        values = redis_client().hmget(key("latest"), [str(i) for i in ids])
    else:
        stored = cache.get(key("latest"), {})
        values = [stored.get(str(i)) for i in ids]
    oldest = (now_ts or time.time()) - float(settings.MONITORING_LATEST_TTL_S)
    out = {}
    for gpu_id, blob in zip(ids, values, strict=True):
        if blob is None:
            continue
        sample = json.loads(blob)
        if sample.get("at_ts", 0) >= oldest:
            out[gpu_id] = sample
    return out


def latest_utilization(gpu_ids: Iterable[int], *, now_ts: float | None = None) -> dict[int, float]:
    """Only the latest utilization per GPU (no JSON to parse): what the heatmap needs."""
    ids = list(gpu_ids)
    if not ids:
        return {}
    if use_redis():
        values = redis_client().hmget(key("latest"), [f"u{i}" for i in ids])
    else:
        stored = cache.get(key("latest"), {})
        values = [stored.get(f"u{i}") for i in ids]
    oldest = (now_ts or time.time()) - float(settings.MONITORING_LATEST_TTL_S)
    out = {}
    for gpu_id, raw in zip(ids, values, strict=True):
        if raw is None:
            continue
        util, _sep, ts = text(raw).partition(",")
        if util and float(ts) >= oldest:
            out[gpu_id] = float(util)
    return out


def windows(
    gpus_by_node: dict[int, list[int]], *, since_ts: float, max_points: int
) -> dict[int, list[Point]]:
    """Window points of the given GPUs (grouped by node) at or after `since_ts`.

    Reads only the last `max_points` heartbeats of each node.
    """
    nodes = list(gpus_by_node)
    if not nodes:
        return {}
    if use_redis():
        pipe = redis_client().pipeline(transaction=False)
        for n in nodes:
            pipe.lrange(key("win", n), -max_points, -1)
        raw_lists: list[list[Any]] = pipe.execute()
    else:
        found = cache.get_many([key("win", n) for n in nodes])
        raw_lists = [found.get(key("win", n), [])[-max_points:] for n in nodes]
    out: dict[int, list[Point]] = {g: [] for gs in gpus_by_node.values() for g in gs}
    for node_id, raws in zip(nodes, raw_lists, strict=True):
        wanted = {str(g) for g in gpus_by_node[node_id]}
        for raw in raws:
            ts_s, _sep, rest = text(raw).partition(";")
            ts = float(ts_s)
            if ts < since_ts:
                continue
            for part in rest.split(";"):
                gpu_s, _c, values = part.partition(",")
                if gpu_s in wanted:
                    out[int(gpu_s)].append(parse_point(f"{ts_s},{values}"))
    return out


def cluster_buckets(*, start_ts: float, end_ts: float) -> dict[int, dict[str, float]]:
    """Fleet counters per 10-second bucket between two instants."""
    first = int(start_ts // CLUSTER_STEP_S) * CLUSTER_STEP_S
    buckets = list(range(first, int(end_ts) + 1, CLUSTER_STEP_S))
    if use_redis():
        pipe = redis_client().pipeline(transaction=False)
        for b in buckets:
            pipe.hgetall(key("cl", b))
        rows = pipe.execute()
        return {
            b: {k.decode(): float(v) for k, v in row.items()}
            for b, row in zip(buckets, rows, strict=True)
            if row
        }
    found = cache.get_many([key("cl", b) for b in buckets])
    return {b: found[key("cl", b)] for b in buckets if key("cl", b) in found}


def last_xids() -> dict[int, tuple[int, float]]:
    """gpu_id → (xid, when) of the last XID each GPU reported."""
    if use_redis():
        raw = {text(k): text(v) for k, v in redis_client().hgetall(key("lastxid")).items()}
    else:
        raw = cache.get(key("lastxid"), {})
    out = {}
    for gpu, value in raw.items():
        xid, ts = value.split(",")
        out[int(gpu)] = (int(xid), float(ts))
    return out


def clear() -> int:
    """Delete every key under the prefix (tests, and the bench between runs)."""
    if not use_redis():
        return 0
    client = redis_client()
    keys = list(client.scan_iter(f"{prefix()}:*", count=1000))
    for i in range(0, len(keys), 1000):
        client.delete(*keys[i : i + 1000])
    return len(keys)
