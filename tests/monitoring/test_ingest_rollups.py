"""Ingest: live window and latest values in Redis, attribution, minute and hour rollups, retention."""

from __future__ import annotations

from datetime import timedelta

import pytest

from foundation.locks import redis_client
from monitoring import live
from monitoring.ingest import ingest_samples
from monitoring.models import ClusterRollup, GpuRollup, Resolution, RollupFlush
from monitoring.rollups import enforce_retention, flush_rollups, rollup_hours
from scheduler.models import Allocation, JobState
from scheduler.transitions import job_transition
from tests.monitoring.conftest import feed, hold, sample

pytestmark = pytest.mark.django_db


def test_heartbeat_telemetry_reaches_the_live_store_attributed_to_the_job(running):
    gpu, job = running["gpu"], running["job"]
    other = running["node"].gpus.exclude(pk=gpu.pk).first()
    resp = running["client"].post(
        "/api/agent/v1/heartbeat",
        {
            "telemetry": [
                {
                    "uuid": gpu.uuid,
                    "utilization": 87.5,
                    "memory_used_mib": 4096,
                    "temperature_c": 61,
                    "power_w": 410.2,
                },
                {"uuid": other.uuid, "utilization": 0, "temperature_c": 35},
            ],
            "running": [],
        },
        format="json",
    )
    assert resp.status_code == 200
    latest = live.latest([gpu.pk, other.pk])
    assert latest[gpu.pk]["utilization"] == 87.5 and latest[gpu.pk]["job_ids"] == [job.pk]
    assert latest[other.pk]["job_ids"] == []
    window = live.windows({gpu.node_id: [gpu.pk]}, since_ts=0, max_points=10)[gpu.pk]
    assert len(window) == 1 and window[0].util == 87.5 and window[0].power == 410.2
    assert window[0].job == job.pk
    raw = redis_client().lrange(live.key("raw", int(window[0].ts // 60)), 0, -1)
    lines = [line for r in raw for line in r.decode().split("\n")]
    assert sorted(line.split(",")[2] for line in lines) == sorted(["0", str(job.pk)])


def test_ingest_reads_the_database_only_when_allocations_changed(
    running, now, django_assert_num_queries
):
    node, gpu = running["node"], running["gpu"]
    gpus = list(node.gpus.all())
    with django_assert_num_queries(1):  # first heartbeat: the node's intervals
        ingest_samples(node=node, samples=[sample(g) for g in gpus], now=now)
    with django_assert_num_queries(0):  # same generation: from the cache
        ingest_samples(node=node, samples=[sample(g) for g in gpus], now=now)
    # the job ends: its allocation's end bumps the node's generation, the next heartbeat
    # re-reads the intervals and samples after the end are no longer the job's
    job_transition(job=running["job"], to=JobState.SUCCEEDED, reason="done")
    ended = Allocation.objects.get(job=running["job"]).ended_at
    with django_assert_num_queries(1):
        ingest_samples(
            node=node, samples=[sample(gpu, age_s=1.0)], now=ended + timedelta(seconds=2)
        )
    assert live.latest([gpu.pk], now_ts=ended.timestamp())[gpu.pk]["job_ids"] == []
    with django_assert_num_queries(0):  # and the re-read intervals are cached again
        ingest_samples(node=node, samples=[sample(gpu)], now=ended + timedelta(seconds=3))


def test_a_batched_heartbeat_lands_each_sample_at_its_instant_and_holder(fleet, now):
    gpu = fleet["nodes"]["l1"].gpus.first()
    minute = now.replace(second=0) - timedelta(minutes=3)
    handover = minute + timedelta(seconds=58)
    first = hold(gpu, now=now, started=minute - timedelta(minutes=10))
    Allocation.objects.filter(job=first).update(ended_at=handover)
    second = hold(gpu, now=now, started=handover)  # its save bumps the generation
    sent = minute + timedelta(minutes=1, seconds=3)  # the heartbeat; samples 1 s apart before it
    batch = [sample(gpu, utilization=10.0 * i, age_s=float(6 - i)) for i in range(6)]
    ingest_samples(node=gpu.node, samples=batch, now=sent)
    points = live.windows({gpu.node_id: [gpu.pk]}, since_ts=0, max_points=10)[gpu.pk]
    base = sent.timestamp()
    assert [(p.ts, p.util, p.job) for p in points] == [
        (base - 6, 0.0, first.pk),  # :57
        (base - 5, 10.0, second.pk),  # :58, the handover instant
        (base - 4, 20.0, second.pk),
        (base - 3, 30.0, second.pk),  # next minute
        (base - 2, 40.0, second.pk),
        (base - 1, 50.0, second.pk),
    ]
    latest = live.latest([gpu.pk], now_ts=base)[gpu.pk]
    assert latest["utilization"] == 50.0 and latest["at_ts"] == base - 1
    assert "age_s" not in latest
    flush_rollups(now=now)
    rows = {
        (r.bucket, r.held_by_job): r.samples
        for r in GpuRollup.objects.filter(gpu=gpu, resolution=Resolution.MINUTE)
    }
    nxt = minute + timedelta(minutes=1)
    assert rows == {(minute, first.pk): 1, (minute, second.pk): 2, (nxt, second.pk): 3}


def test_minute_flush_writes_attributed_rollups_once(running, now):
    node, gpu, job = running["node"], running["gpu"], running["job"]
    other = node.gpus.exclude(pk=gpu.pk).first()
    start = now.replace(second=0) - timedelta(minutes=5)
    ingest_samples(node=node, samples=[sample(gpu, utilization=2.0, power_w=100)], now=start)
    ingest_samples(
        node=node,
        samples=[sample(gpu, utilization=80.0, power_w=300)],
        now=start + timedelta(seconds=20),
    )
    ingest_samples(node=node, samples=[sample(other, utilization=10.0)], now=start)
    # the current minute is still open: it stays queued
    ingest_samples(node=node, samples=[sample(gpu)], now=now)
    assert flush_rollups(now=now) == 3
    row = GpuRollup.objects.get(resolution=Resolution.MINUTE, gpu=gpu, bucket=start)
    assert row.held_by_job == job.pk and row.share_milli == 1000
    assert row.samples == 2 and row.idle_samples == 1
    assert row.util_avg == pytest.approx(41.0) and row.util_max == 80.0
    assert row.power_avg == pytest.approx(200.0) and row.power_max == 300.0
    idle = GpuRollup.objects.get(resolution=Resolution.MINUTE, gpu=other, bucket=start)
    assert idle.held_by_job == 0 and idle.samples == 1
    fleet_row = ClusterRollup.objects.get(resolution=Resolution.MINUTE, bucket=start)
    assert fleet_row.samples == 3 and fleet_row.held_samples == 2
    assert fleet_row.util_avg == pytest.approx((2 + 80 + 10) / 3)
    # flushing again writes nothing new
    assert flush_rollups(now=now) == 0
    assert GpuRollup.objects.filter(resolution=Resolution.MINUTE, bucket=start).count() == 2
    # late samples for a flushed minute merge into it (weighted), not beside it
    ingest_samples(node=node, samples=[sample(gpu, utilization=20.0)], now=start)
    assert flush_rollups(now=now) == 1
    row.refresh_from_db()
    assert row.samples == 3 and row.util_avg == pytest.approx((2 + 80 + 20) / 3)


def test_a_gpu_removed_before_the_flush_does_not_block_the_minute(running, now):
    node, gpu = running["node"], running["gpu"]
    other = node.gpus.exclude(pk=gpu.pk).first()
    start = now.replace(second=0) - timedelta(minutes=2)
    ingest_samples(node=node, samples=[sample(gpu), sample(other)], now=start)
    other.delete()  # an operator removed the GPU by hand before its samples were rolled up
    assert flush_rollups(now=now) == 2
    assert list(GpuRollup.objects.values_list("gpu_id", flat=True)) == [gpu.pk]
    assert flush_rollups(now=now) == 0  # nothing left queued to fail again


def test_a_retried_flush_does_not_count_a_batch_twice(running, now):
    node, gpu = running["node"], running["gpu"]
    start = now.replace(second=0) - timedelta(minutes=3)
    ingest_samples(node=node, samples=[sample(gpu)], now=start)
    client = redis_client()
    minute = int(start.timestamp() // 60)
    # a flush renamed the batch and wrote it, then died before deleting it
    token = f"{minute}:deadbeef"
    client.rename(live.key("raw", minute), live.key("proc", token))
    client.srem(live.key("raw-minutes"), minute)
    client.sadd(live.key("proc-set"), token)
    RollupFlush.objects.create(token=token, bucket=start, samples=1)
    assert flush_rollups(now=now) == 0
    assert not GpuRollup.objects.exists()
    assert not client.exists(live.key("proc", token))
    # a batch renamed but never written is written by the next flush
    ingest_samples(node=node, samples=[sample(gpu)], now=start)
    token2 = f"{minute}:cafef00d"
    client.rename(live.key("raw", minute), live.key("proc", token2))
    client.sadd(live.key("proc-set"), token2)
    assert flush_rollups(now=now) == 1
    assert GpuRollup.objects.get().samples == 1


def test_hour_rollups_replace_and_retention_deletes_old_rows(running, now, settings):
    node, gpu, job = running["node"], running["gpu"], running["job"]
    hour = now.replace(minute=0, second=0)
    feed(node, [gpu], start=hour - timedelta(minutes=50), minutes=20, utilization=30.0)
    flush_rollups(now=now + timedelta(minutes=5))
    assert rollup_hours(now=now) >= 1
    assert rollup_hours(now=now) >= 1  # idempotent: replaces
    h = GpuRollup.objects.get(
        resolution=Resolution.HOUR, gpu=gpu, held_by_job=job.pk, bucket=hour - timedelta(hours=1)
    )
    assert h.samples == 40 and h.util_avg == pytest.approx(30.0)
    assert ClusterRollup.objects.filter(resolution=Resolution.HOUR).exists()
    settings.MONITORING_MINUTE_RETENTION_DAYS = 1
    settings.MONITORING_HOUR_RETENTION_DAYS = 3
    out = enforce_retention(now=now + timedelta(days=2))
    assert out["gpu_1m"] == 20 and out["gpu_1h"] == 0
    assert not GpuRollup.objects.filter(resolution=Resolution.MINUTE).exists()
    enforce_retention(now=now + timedelta(days=4))
    assert not GpuRollup.objects.exists()


def test_shared_gpu_samples_go_to_every_holder(fleet, now):
    gpu = fleet["nodes"]["l1"].gpus.first()
    j1 = hold(gpu, share=500, now=now)
    j2 = hold(gpu, share=500, now=now)
    start = now.replace(second=0) - timedelta(minutes=2)
    ingest_samples(node=gpu.node, samples=[sample(gpu, utilization=60.0)], now=start)
    flush_rollups(now=now)
    rows = {r.held_by_job: r for r in GpuRollup.objects.filter(gpu=gpu)}
    assert set(rows) == {j1.pk, j2.pk} and all(r.share_milli == 500 for r in rows.values())
    assert ClusterRollup.objects.get(bucket=start).samples == 1  # the device counted once


def test_embedded_default_without_redis_merges_at_ingest(running, now, settings):
    settings.REDIS_URL = ""
    node, gpu = running["node"], running["gpu"]
    ingest_samples(node=node, samples=[sample(gpu, utilization=40.0)], now=now)
    ingest_samples(node=node, samples=[sample(gpu, utilization=60.0)], now=now)
    row = GpuRollup.objects.get(gpu=gpu)
    assert row.samples == 2 and row.util_avg == pytest.approx(50.0)
    assert live.latest([gpu.pk])[gpu.pk]["utilization"] == 60.0
    assert [
        p.util for p in live.windows({node.pk: [gpu.pk]}, since_ts=0, max_points=5)[gpu.pk]
    ] == [40, 60]
