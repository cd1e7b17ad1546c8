"""How fast silent nodes may be declared lost: Kubernetes' node lifecycle controller, per pool.

Declaring a node lost requeues everything on it. When the portal itself is the problem (its web
tier overloaded, a network partition), heartbeats time out on healthy nodes, and declaring them
lost turns a portal problem into a fleet-wide requeue. So, as Kubernetes does per zone:

- a pool is **normal** while fewer than `min_unhealthy` of its nodes, or less than
  `unhealthy_threshold` of them, are unhealthy (silent now, or already lost): silent nodes are
  declared lost at `primary_rate` nodes per second;
- **partially disrupted** past that: at `secondary_rate` — or not at all in a pool smaller than
  `large_pool_size`, where a handful of nodes is already the fraction;
- **fully disrupted** when none of its nodes is healthy: nobody is declared lost there; the
  likelier story is that the portal cannot hear the pool.

Lost nodes keep counting as unhealthy, so a loss that creeps in a few nodes at a time slows
down as it grows, not only a sudden mass silence. A token bucket per pool carries the rate
between sweeps. Pure: the sweep (scheduler/nodes) reads the pools and applies the verdicts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum


class Disruption(StrEnum):
    NORMAL = "normal"
    PARTIAL = "partial"
    FULL = "full"


@dataclass(frozen=True)
class EvictionPolicy:
    """Defaults are Kubernetes' (kube-controller-manager's node lifecycle flags)."""

    unhealthy_threshold: float = 0.55  # --unhealthy-zone-threshold
    min_unhealthy: int = 3  # a pool is disrupted only with more than two unhealthy nodes
    primary_rate: float = 0.1  # --node-eviction-rate, nodes per second
    secondary_rate: float = 0.01  # --secondary-node-eviction-rate
    large_pool_size: int = 50  # --large-cluster-size-threshold
    burst: int = 1  # tokens a bucket holds at most


@dataclass(frozen=True)
class PoolHealth:
    healthy: int  # watched nodes whose heartbeats arrive
    silent: int  # watched nodes past the silence limit, not yet declared lost
    lost: int  # nodes already declared lost (not retired)

    @property
    def unhealthy(self) -> int:
        return self.silent + self.lost

    @property
    def size(self) -> int:
        return self.healthy + self.unhealthy


def disruption(health: PoolHealth, policy: EvictionPolicy) -> Disruption:
    if health.unhealthy == 0:
        return Disruption.NORMAL
    if health.healthy == 0:
        return Disruption.FULL
    if (
        health.unhealthy >= policy.min_unhealthy
        and health.unhealthy / health.size >= policy.unhealthy_threshold
    ):
        return Disruption.PARTIAL
    return Disruption.NORMAL


def eviction_rate(health: PoolHealth, policy: EvictionPolicy) -> float:
    """Nodes per second that may be declared lost in this pool now."""
    state = disruption(health, policy)
    if state is Disruption.NORMAL:
        return policy.primary_rate
    if state is Disruption.PARTIAL:
        return policy.secondary_rate if health.size > policy.large_pool_size else 0.0
    return 0.0


@dataclass(frozen=True)
class Bucket:
    tokens: float
    at: float  # seconds (epoch) when `tokens` was true


def bucket_take(
    bucket: Bucket | None, *, now: float, rate: float, want: int, burst: int
) -> tuple[int, Bucket]:
    """Refill at `rate` since the bucket's time (up to `burst`), take up to `want` whole tokens.

    A new bucket starts full. A rate of 0 refills nothing (and takes nothing, even if tokens
    were left from a calmer time): a disrupted pool stops at once."""
    if bucket is None:
        bucket = Bucket(tokens=float(burst), at=now)
    if rate <= 0:
        return 0, Bucket(tokens=bucket.tokens, at=now)
    tokens = min(float(burst), bucket.tokens + max(0.0, now - bucket.at) * rate)
    taken = min(want, math.floor(tokens))
    return taken, Bucket(tokens=tokens - taken, at=now)


@dataclass(frozen=True)
class Verdict:
    pool: str
    state: Disruption
    rate: float
    declare: int  # how many of the silent nodes to declare lost now (oldest silence first)
    held: int  # silent nodes left for later sweeps
    bucket: Bucket

    @property
    def message(self) -> str:
        if self.held == 0:
            return ""
        if self.state is Disruption.FULL:
            return (
                f"Pool {self.pool}: every node is silent, so the portal suspects itself or the "
                f"network and declares none lost ({self.held} held)."
            )
        if self.rate == 0:
            return (
                f"Pool {self.pool}: most nodes are unhealthy and the pool is small, so nodes are "
                f"no longer declared lost automatically ({self.held} held)."
            )
        return (
            f"Pool {self.pool}: {self.held} silent nodes wait; nodes are declared lost at "
            f"{self.rate * 60:g} a minute while the pool is {self.state.value}ly disrupted."
            if self.state is Disruption.PARTIAL
            else f"Pool {self.pool}: {self.held} silent nodes wait their turn "
            f"({self.rate * 60:g} a minute)."
        )


def sweep_verdict(
    pool: str,
    health: PoolHealth,
    *,
    bucket: Bucket | None,
    now: float,
    policy: EvictionPolicy,
) -> Verdict:
    state = disruption(health, policy)
    rate = eviction_rate(health, policy)
    taken, after = bucket_take(bucket, now=now, rate=rate, want=health.silent, burst=policy.burst)
    return Verdict(
        pool=pool,
        state=state,
        rate=rate,
        declare=taken,
        held=health.silent - taken,
        bucket=after,
    )
