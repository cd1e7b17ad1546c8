"""Node loss rate limits per pool, as Kubernetes' node lifecycle controller does per zone."""

from __future__ import annotations

import pytest

from scheduler.eviction_rules import (
    Bucket,
    Disruption,
    EvictionPolicy,
    PoolHealth,
    bucket_take,
    disruption,
    eviction_rate,
    sweep_verdict,
)

K8S = EvictionPolicy()


@pytest.mark.parametrize(
    ("healthy", "silent", "lost", "state"),
    [
        (10, 0, 0, Disruption.NORMAL),
        (10, 1, 1, Disruption.NORMAL),  # 2 unhealthy: below the minimum count
        (2, 2, 0, Disruption.NORMAL),  # half, but only 2 nodes
        (2, 3, 0, Disruption.PARTIAL),  # 3 of 5 = 60% ≥ 55%
        (5, 3, 3, Disruption.NORMAL),  # 6 of 11 = 54.5 %, just under 55 %
        (0, 4, 0, Disruption.FULL),
        (0, 1, 5, Disruption.FULL),
        (100, 30, 0, Disruption.NORMAL),  # 23%
        (40, 10, 50, Disruption.PARTIAL),  # gradual: the lost keep counting, 60 of 100
    ],
)
def test_pool_disruption(healthy, silent, lost, state):
    assert disruption(PoolHealth(healthy=healthy, silent=silent, lost=lost), K8S) is state


@pytest.mark.parametrize(
    ("healthy", "silent", "lost", "rate"),
    [
        (10, 1, 0, 0.1),  # normal: primary rate
        (40, 31, 30, 0.01),  # partial in a large pool (101 nodes): secondary rate
        (4, 6, 0, 0.0),  # partial in a small pool: stop
        (0, 60, 0, 0.0),  # fully disrupted: stop
    ],
)
def test_eviction_rate(healthy, silent, lost, rate):
    assert eviction_rate(PoolHealth(healthy, silent, lost), K8S) == rate


def test_a_bucket_starts_full_refills_at_the_rate_and_caps_at_the_burst():
    taken, b = bucket_take(None, now=1000.0, rate=0.1, want=5, burst=1)
    assert taken == 1 and b.tokens == 0
    taken, b = bucket_take(b, now=1005.0, rate=0.1, want=5, burst=1)  # half a token
    assert taken == 0 and b.tokens == pytest.approx(0.5)
    taken, b = bucket_take(b, now=1010.0, rate=0.1, want=5, burst=1)
    assert taken == 1
    taken, b = bucket_take(b, now=2000.0, rate=0.1, want=5, burst=3)  # long calm: up to burst
    assert taken == 3


def test_rate_zero_takes_nothing_even_with_tokens_left():
    taken, b = bucket_take(Bucket(tokens=1.0, at=0.0), now=10.0, rate=0.0, want=3, burst=1)
    assert taken == 0 and b.tokens == 1.0


def test_a_creeping_loss_slows_then_stops():
    """Nodes fall silent a few at a time; the sweep declares fewer and fewer lost."""
    policy = EvictionPolicy(large_pool_size=50)
    total, lost, bucket, now = 60, 0, None, 0.0
    declared_per_minute = []
    for minute in range(10):
        declared = 0
        for _ in range(6):  # a sweep every 10 s
            now += 10
            silent = max(0, min(total, 4 * (minute + 1)) - lost)  # silence spreads
            healthy = total - lost - silent
            verdict = sweep_verdict(
                "p", PoolHealth(healthy, silent, lost), bucket=bucket, now=now, policy=policy
            )
            bucket = verdict.bucket
            lost += verdict.declare
            declared += verdict.declare
        declared_per_minute.append(declared)
    # 4 more nodes fall silent each minute: while under 55 % all are declared lost (the primary
    # rate allows 6 a minute); from minute 8 (36 of 60 unhealthy) at most 0.6 a minute
    assert declared_per_minute[:8] == [4] * 8
    assert all(d <= 1 for d in declared_per_minute[8:]) and sum(declared_per_minute[8:]) >= 1
    assert 33 <= lost <= 35  # of 40 silent by the end: the rest wait


def test_a_fully_silent_pool_declares_none_and_says_why():
    verdict = sweep_verdict(
        "gpu-a", PoolHealth(healthy=0, silent=12, lost=0), bucket=None, now=0.0, policy=K8S
    )
    assert verdict.declare == 0 and verdict.held == 12 and verdict.state is Disruption.FULL
    assert "declares none lost" in verdict.message
