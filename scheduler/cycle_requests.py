"""Asking for a scheduling cycle: requests coalesce; the cycle task is queued by name.

Services call `request_cycle` after commit; `scheduler.tasks.scheduling_cycle` runs the cycle.

Two cache keys carry the requests, so that a burst of submits costs the worker one task message,
not one per cycle plus the retries of those that found a cycle running:

- `CYCLE_REQUESTED`: a cycle task is queued, or running and bound to look at `CYCLE_DIRTY` before
  it finishes. Whoever adds it sends the task; while it is there, requests send nothing.
- `CYCLE_DIRTY`: a request came since the running cycle last read the queue. The running task
  clears it before each pass reads the queue and runs another pass while it is set.

A request sets `CYCLE_DIRTY` before it tries to add `CYCLE_REQUESTED`, and a finishing task deletes
`CYCLE_REQUESTED` before it looks at `CYCLE_DIRTY` a last time: either the task sees the request,
or the request sees no task and sends one. Nothing queued is missed.
"""

from __future__ import annotations

from django.conf import settings
from django.core.cache import cache
from django.db import transaction

from foundation.enqueue import enqueue, run_inline
from foundation.redis_after_commit import after_commit, redis_cache

CYCLE_TASK = "scheduler.cycle"
CYCLE_REQUESTED = "scheduler:cycle-requested"
CYCLE_DIRTY = "scheduler:cycle-dirty"
_QUEUED, _RUNNING = 1, 2  # CYCLE_REQUESTED's values: set by a request, by a running cycle
CYCLE_REQUESTED_TTL = 5  # a lost task message (a worker killed before it ran) blocks no longer
CYCLE_RETRY_SECONDS = 0.25  # a cycle that found another running tries again this much later
# A pass asked for while one ran starts this long after that one started, at the earliest: a
# burst of submits is planned in batches (the cadence the retries above gave it).
CYCLE_BATCH_SECONDS = 0.25
CYCLE_LOOP_SECONDS = 20.0  # then the task hands over to a fresh one (its time limit is 60 s)


def request_cycle() -> None:
    """Ask for a cycle soon (job submitted or ended). Call after commit.

    Requests coalesce: while a cycle is queued or running, a request only marks the queue
    changed, and the running cycle plans again after its pass.
    """
    if getattr(settings, "SCHEDULER_SYNC_CYCLE", False):
        run_inline(CYCLE_TASK)
        return
    cache.set(CYCLE_DIRTY, 1, timeout=None)
    if cache.add(CYCLE_REQUESTED, _QUEUED, timeout=CYCLE_REQUESTED_TTL):
        enqueue(CYCLE_TASK)


def request_cycle_on_commit() -> None:
    """`request_cycle` once the current transaction commits; on Redis, in the round trip of
    the after-commit commands queued just before (a submit's push message): the same `SET`
    and `SET NX EX`, in the same order, that `cache.set` and `cache.add` send, and the task
    queued when the second set its key."""
    backend = redis_cache()
    if getattr(settings, "SCHEDULER_SYNC_CYCLE", False) or backend is None:
        transaction.on_commit(request_cycle)
        return
    serializer = backend._cache._serializer  # type: ignore[attr-defined]  # as the cache stores
    after_commit(
        backend,
        [
            ("SET", backend.make_and_validate_key(CYCLE_DIRTY), serializer.dumps(1)),
            (
                "SET",
                backend.make_and_validate_key(CYCLE_REQUESTED),
                serializer.dumps(_QUEUED),
                "EX",
                CYCLE_REQUESTED_TTL,
                "NX",
            ),
        ],
        on_answers=lambda answers: enqueue(CYCLE_TASK) if answers[1] else None,
    )


def pass_begin() -> None:
    """Before a pass reads the queue: it sees every request so far; it holds the queued flag."""
    cache.set(CYCLE_REQUESTED, _RUNNING, timeout=CYCLE_REQUESTED_TTL)
    cache.delete(CYCLE_DIRTY)


def requested_since_pass() -> bool:
    """Whether a request came after the last pass began reading the queue."""
    return bool(cache.get(CYCLE_DIRTY))


def requests_release() -> bool:
    """A finishing task (its lock already released) lets requests send tasks again. True when a
    request came meanwhile and no task was sent for it: the caller sends one."""
    cache.delete(CYCLE_REQUESTED)
    return requested_since_pass() and cache.add(
        CYCLE_REQUESTED, _QUEUED, timeout=CYCLE_REQUESTED_TTL
    )


def request_deferred() -> bool:
    """A task that found a cycle running leaves its request to it. True when that cycle may not
    see it (it is finishing, or it is no task of ours: nothing marks the flag as a running
    cycle's): the caller retries later itself."""
    cache.set(CYCLE_DIRTY, 1, timeout=None)
    if cache.add(CYCLE_REQUESTED, _QUEUED, timeout=CYCLE_REQUESTED_TTL):
        return True
    return cache.get(CYCLE_REQUESTED) != _RUNNING
