"""Execution backends: who runs a pool's jobs.

- ``agents`` (the default): our scheduler places jobs on nodes whose agents start them
  (`scheduler.cycle`, `scheduler.nodes`, `agent/`).
- ``slurm``: the pool fronts a Slurm cluster (`scheduler.backends.slurm`). The portal keeps
  admission (quotas, budgets, prices), pages and invoices; Slurm's own scheduler places the work.
  The cycle hands such jobs over (`handoff`) instead of planning them.

A backend answers four questions for the rest of the portal: submit the queued jobs it owns,
cancel one, read back states and usage. `backend_of` names a pool's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scheduler.models import Job, Pool


def backend_of(pool: Pool | None) -> str:
    from scheduler.models import Pool

    return pool.backend if pool is not None else Pool.Backend.AGENTS


def is_external(job: Job) -> bool:
    """True when the job runs under another engine (its pool is not run by our agents)."""
    from scheduler.models import Pool

    return job.pool_id is not None and backend_of(job.pool) != Pool.Backend.AGENTS


def handoff() -> int:
    """The cycle's hand-off point: submit the queued jobs of external pools. Returns how many."""
    from scheduler.backends.slurm.submit import submit_queued

    return submit_queued()


def cancel(job: Job) -> None:
    """Stop the job where it runs (after our own state is Cancelled)."""
    from scheduler.models import Pool

    if backend_of(job.pool) == Pool.Backend.SLURM:
        from scheduler.backends.slurm.submit import cancel_job

        cancel_job(job)
