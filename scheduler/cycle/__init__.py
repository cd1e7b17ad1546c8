"""The scheduling cycle, one module per step: read → state → plan → apply (`run` drives them).

- `reads`: the cycle's reads, compiled to SQL once, as named rows (a fenced fast path).
- `state`: those rows as the pure core's immutable snapshot and queue (`build_state`).
- `plan`: the pools' policy, and the core's `plan` on the state.
- `apply`: the plan written in one transaction (no GPU over-allocated, whatever runs
  concurrently), and why each unplaced job waits (`record_pending`).
- `run`: one whole cycle (`run_cycle`), with what it settles before planning.

Asking for a cycle (coalesced requests, the Celery task by name) is `scheduler.cycle_requests`,
which services import without loading the cycle.
"""

from scheduler.cycle.apply import CycleResult, apply_plan, record_pending
from scheduler.cycle.plan import orders_by_fair_share, policy_config
from scheduler.cycle.run import expire_stale_preemptions, run_cycle
from scheduler.cycle.state import (
    CycleInput,
    build_state,
    from_ts,
    job_request,
    job_request_from_row,
    node_unavailable,
    ts,
)

__all__ = [
    "CycleInput",
    "CycleResult",
    "apply_plan",
    "build_state",
    "expire_stale_preemptions",
    "from_ts",
    "job_request",
    "job_request_from_row",
    "node_unavailable",
    "orders_by_fair_share",
    "policy_config",
    "record_pending",
    "run_cycle",
    "ts",
]
