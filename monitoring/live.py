"""The live telemetry store: the latest sample and a short window per GPU, in Redis.

Keys (prefix `settings.MONITORING_KEY_PREFIX`, "mon" by default):

- `mon:latest`            hash gpu_id → JSON of its newest sample (with `at_ts`, `job_ids`), and
                          "u<gpu_id>" → "utilization,ts" for the heatmap;
                          readers drop samples older than MONITORING_LATEST_TTL_S;
- `mon:win:<node_id>`     list, one element per heartbeat: its sampled instants, oldest first,
                          "ts;gpu,util,mem,temp,power,job;gpu,...|ts;...", capped at
                          MONITORING_LIVE_POINTS heartbeats, expires with the window;
- `mon:raw:<minute>`      raw samples of one minute, one element per heartbeat ("\n"-joined
                          lines), waiting for the rollup flush;
- `mon:raw-minutes`       set of minutes with raw samples; `mon:proc-set` batches being flushed;
- `mon:cl:<10 s bucket>`  hash of fleet counters per GPU model (n, util sum, held) for live charts;
- `mon:lastxid`           hash gpu_id → "xid,ts" of the last XID each GPU reported;
- `mon:gen`               hash node_id → allocation generation (see monitoring.ingest);
- `mon:overview:<range>`  (Django cache) the cluster overview JSON, shared for a moment.

One heartbeat is one Redis command (EVALSHA of WRITE_SCRIPT), whatever the number of GPUs and
samples. Without Redis (the embedded default) the same reads and writes go to the Django cache,
which is good enough for a one-laptop demo and not meant for a fleet.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.cache import cache

from foundation import push
from foundation.locks import redis_client

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
    """Everything one heartbeat writes (one or more samples per GPU), sent as one Redis command."""

    now_ts: float
    node_id: int = 0
    latest: dict[int, str] = field(default_factory=dict)  # gpu_id → JSON of its newest sample
    utils: dict[int, str] = field(default_factory=dict)  # gpu_id → "util,ts" (for the heatmap)
    slices: dict[float, list[str]] = field(default_factory=dict)  # ts → ["gpu,u,m,t,p,job"]
    raw: dict[int, list[str]] = field(default_factory=dict)  # minute → raw sample lines
    cluster: dict[int, dict[str, float]] = field(default_factory=dict)  # 10 s bucket → counters
    xids: dict[int, str] = field(default_factory=dict)
    jobs: set[int] = field(default_factory=set)  # jobs with samples in it (pushed updates)

    def count(self, ts: float, model: str, util: float | None, held: bool) -> None:
        if util is None:
            return
        bucket = int(ts // CLUSTER_STEP_S) * CLUSTER_STEP_S
        c = self.cluster.get(bucket)
        if c is None:
            c = self.cluster[bucket] = {}
        c[f"n:{model}"] = c.get(f"n:{model}", 0) + 1
        c[f"u:{model}"] = c.get(f"u:{model}", 0.0) + util
        if held:
            c[f"h:{model}"] = c.get(f"h:{model}", 0) + 1

    def window_entry(self) -> str:
        """One list element per heartbeat: its sample instants, oldest first, '|'-separated."""
        return "|".join(
            f"{ts:.3f};" + ";".join(points) for ts, points in sorted(self.slices.items())
        )


# One heartbeat, one command: the writes run only if the node's allocation generation is still
# the one the batch was attributed with; otherwise the script returns the current generation and
# the caller re-reads the holders and tries again (optimistic, no lock, no SQL when unchanged).
WRITE_SCRIPT = """
local p, node = ARGV[1], ARGV[2]
local gen = redis.call('HGET', p .. ':gen', node) or '0'
if ARGV[3] ~= '*' and gen ~= ARGV[3] then return gen end
local i = 4
local n = tonumber(ARGV[i]); i = i + 1
if n > 0 then
  redis.call('HSET', p .. ':latest', unpack(ARGV, i, i + 2 * n - 1)); i = i + 2 * n
end
if ARGV[i] ~= '' then
  local w = p .. ':win:' .. node
  redis.call('RPUSH', w, ARGV[i])
  redis.call('LTRIM', w, -tonumber(ARGV[i + 1]), -1)
  redis.call('EXPIRE', w, ARGV[i + 2])
end
i = i + 3
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  local r = p .. ':raw:' .. ARGV[i]
  redis.call('RPUSH', r, ARGV[i + 1])
  redis.call('SADD', p .. ':raw-minutes', ARGV[i])
  redis.call('EXPIRE', r, 86400)
  i = i + 2
end
n = tonumber(ARGV[i]); i = i + 1
local ttl = ARGV[i]; i = i + 1
for _ = 1, n do
  local c = p .. ':cl:' .. ARGV[i]
  local k = tonumber(ARGV[i + 1]); i = i + 2
  for _ = 1, k do
    if string.sub(ARGV[i], 1, 2) == 'u:' then
      redis.call('HINCRBYFLOAT', c, ARGV[i], ARGV[i + 1])
    else
      redis.call('HINCRBY', c, ARGV[i], ARGV[i + 1])
    end
    i = i + 2
  end
  redis.call('EXPIRE', c, ttl)
end
n = tonumber(ARGV[i]); i = i + 1
if n > 0 then redis.call('HSET', p .. ':lastxid', unpack(ARGV, i, i + 2 * n - 1)) end
i = i + 2 * n
n = tonumber(ARGV[i]); i = i + 1
for j = i + 1, i + n do redis.call('PUBLISH', ARGV[j], ARGV[i]) end
return false
"""

_script: Any = None


def _write_script() -> Any:
    """Fast path (Lua, `bench.telemetry_ingest`): one command per heartbeat."""
    global _script
    client = redis_client()
    if _script is None or _script.registered_client is not client:
        _script = client.register_script(WRITE_SCRIPT)
    return _script


def write(batch: Batch, *, generation: str = "*") -> str | None:
    """Write one heartbeat: latest, window entry, raw samples, fleet counters, XIDs.

    With Redis it is one EVALSHA. `generation` is the node's allocation generation the batch was
    attributed with ("*": unconditional); if it changed meanwhile nothing is written and the
    current generation is returned, so the caller can attribute again. None means written.
    """
    window_s = int(settings.MONITORING_LIVE_WINDOW_S)
    points = int(settings.MONITORING_LIVE_POINTS)
    entry = batch.window_entry()
    if not use_redis():
        _cache_write(batch, entry, window_s, points)
        return None
    args: list[Any] = [prefix(), batch.node_id, generation, len(batch.latest) + len(batch.utils)]
    for gpu_id, blob in batch.latest.items():
        args += (gpu_id, blob)
    for gpu_id, util in batch.utils.items():
        args += (f"u{gpu_id}", util)
    args += (entry, points, window_s, len(batch.raw))
    for minute, lines in batch.raw.items():
        args += (minute, "\n".join(lines))
    args += (len(batch.cluster), window_s + 120)
    for bucket, counters in batch.cluster.items():
        args += (bucket, len(counters))
        for name, value in counters.items():
            args += (name, repr(float(value)) if name.startswith("u:") else int(value))
    args.append(len(batch.xids))
    for gpu_id, xid in batch.xids.items():
        args += (gpu_id, xid)
    channels = push_channels(batch)
    args += (len(channels), TELEMETRY_MESSAGE, *channels)
    result = _write_script()(args=args)
    return None if result is None else text(result)


TELEMETRY_MESSAGE = '{"k":"telemetry"}'


def push_channels(batch: Batch) -> list[str]:
    """Where the write script announces the heartbeat (`foundation.push`): the node's page, the
    pages of the jobs it has samples of, the cluster overview. Published in the same command."""
    if not push.enabled():
        return []
    return [
        push.node_channel(batch.node_id),
        *(push.job_channel(job) for job in sorted(batch.jobs)),
        push.cluster_channel(),
    ]


def generation(node_id: int) -> str:
    """The node's allocation generation (bumped whenever an allocation on it starts or ends)."""
    raw = redis_client().hget(key("gen"), str(node_id))
    return "0" if raw is None else text(raw)


def bump_generations(node_ids: Iterable[int]) -> None:
    ids = sorted(set(node_ids))
    if not ids or not use_redis():
        return
    pipe = redis_client().pipeline(transaction=False)
    for node_id in ids:
        pipe.hincrby(key("gen"), str(node_id), 1)
    pipe.execute()


def _cache_write(batch: Batch, entry: str, window_s: int, points: int) -> None:
    """The embedded default: read-modify-write through the Django cache (one process, demo scale)."""
    latest_all = cache.get(key("latest"), {})
    latest_all.update({str(k): v for k, v in batch.latest.items()})
    latest_all.update({f"u{k}": v for k, v in batch.utils.items()})
    cache.set(key("latest"), latest_all, timeout=None)
    if entry:
        wkey = key("win", batch.node_id)
        cache.set(wkey, [*cache.get(wkey, []), entry][-points:], timeout=window_s)
    for bucket, values in batch.cluster.items():
        ckey = key("cl", bucket)
        counters = cache.get(ckey, {})
        for name, value in values.items():
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
        # Newest first in growing steps: stop once an entry older than `since_ts` was read.
        raw_lists: list[list[Any]] = [[] for _ in nodes]
        todo = list(range(len(nodes)))
        step = max(1, min(max_points, 64))
        got = 0
        while todo and got < max_points:
            take = min(step, max_points - got)
            pipe = redis_client().pipeline(transaction=False)
            for i in todo:
                pipe.lrange(key("win", nodes[i]), -(got + take), -(got + 1))
            more = []
            for i, chunk in zip(todo, pipe.execute(), strict=True):
                raw_lists[i][:0] = chunk
                first = text(chunk[0]).partition(";")[0] if chunk else ""
                if len(chunk) == take and first and float(first) >= since_ts:
                    more.append(i)
            todo, got, step = more, got + take, step * 4
    else:
        found = cache.get_many([key("win", n) for n in nodes])
        raw_lists = [found.get(key("win", n), [])[-max_points:] for n in nodes]
    out: dict[int, list[Point]] = {g: [] for gs in gpus_by_node.values() for g in gs}
    for node_id, raws in zip(nodes, raw_lists, strict=True):
        wanted = {str(g): out[g] for g in gpus_by_node[node_id]}
        for raw in raws:
            for instant in text(raw).split("|"):
                ts_s, _sep, rest = instant.partition(";")
                ts = float(ts_s)
                if ts < since_ts:
                    continue
                for part in rest.split(";"):
                    gpu_s, _c, values = part.partition(",")
                    points = wanted.get(gpu_s)
                    if points is not None:
                        util, mem, temp, power, job = values.split(",")
                        points.append(
                            Point(ts, _num(util), _num(mem), _num(temp), _num(power), int(job or 0))
                        )
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
