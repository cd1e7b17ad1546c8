"""The cycle's plan step: the pools' policy, then the pure core's `plan` on the state.

The core decides against the immutable snapshot (`scheduler.core.plan`); this module only
chooses the policy it plans under and whether that policy needs the projects' usage.
"""

from __future__ import annotations

from datetime import datetime

from django.core.exceptions import ImproperlyConfigured

import scheduler.cycle.reads as reads
from scheduler.core.plan import QUEUE_POLICIES, Plan, PolicyConfig, plan
from scheduler.core.scorers import SCORER_NAMES
from scheduler.cycle.state import CycleInput, ts


def policy_config() -> PolicyConfig:
    """The first pool's policy (every pool is planned under it). A name the core does not know
    (written around the admin's choices) is refused with the names it does know."""
    for queue, scorer, backfill, preemption in reads.POOL_POLICY.rows():
        if queue not in QUEUE_POLICIES:
            raise ImproperlyConfigured(
                f"The pool's queue policy {queue!r} is unknown; choose one of "
                f"{', '.join(QUEUE_POLICIES)} (admin: Pools)."
            )
        if scorer not in SCORER_NAMES:
            raise ImproperlyConfigured(
                f"The pool's scorer {scorer!r} is unknown; choose one of "
                f"{', '.join(SCORER_NAMES)} (admin: Pools)."
            )
        return PolicyConfig(queue=queue, scorer=scorer, backfill=backfill, preemption=preemption)
    return PolicyConfig()


def orders_by_fair_share(config: PolicyConfig) -> bool:
    """Whether planning under `config` reads the projects' decayed usage."""
    return any(c.queue == "fairshare" for c in (config, *config.pools.values()))


def plan_cycle(state: CycleInput, config: PolicyConfig, *, now: datetime) -> Plan:
    """The core's plan for the state under `config`, at `now`."""
    return plan(state.snapshot, state.queue, config, ts(now))
