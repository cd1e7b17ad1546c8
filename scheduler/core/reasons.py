"""Why a job is not running yet: a closed set of reasons with plain-language messages."""

from __future__ import annotations

import enum
from datetime import UTC, datetime


class PendingReason(enum.StrEnum):
    NO_CAPACITY = "no_capacity"
    NO_MATCHING_GPU = "no_matching_gpu"
    NODES_UNAVAILABLE = "nodes_unavailable"
    NODE_CONSTRAINTS = "node_constraints"
    QUOTA = "quota"
    BUDGET = "budget"
    WAITING_FOR_GANG = "waiting_for_gang"
    BLOCKED_BY_RESERVATION = "blocked_by_reservation"
    WAITING_IN_QUEUE = "waiting_in_queue"
    PREEMPTING = "preempting"
    INVALID_REQUEST = "invalid_request"
    DEPENDENCY = "dependency"

    @property
    def label(self) -> str:
        return _LABELS[self]

    @property
    def can_start_later(self) -> bool:
        """False when the job will never start as submitted (fix the request or the quota)."""
        return self not in (PendingReason.NO_MATCHING_GPU, PendingReason.INVALID_REQUEST)

    def message(
        self,
        *,
        what: str,
        ahead: int,
        now: float,
        estimated_start: float | None = None,
        ending_job: int | None = None,
        detail: str = "",
    ) -> str:
        """One or two sentences for the researcher who submitted the job."""
        head = _HEADLINES[self].format(what=what, detail=detail).rstrip(": ")
        parts = [head]
        if self.can_start_later and self not in (PendingReason.BUDGET, PendingReason.QUOTA):
            parts.append(
                "no job ahead" if ahead == 0 else f"{ahead} job{'s' if ahead != 1 else ''} ahead"
            )
            if estimated_start is not None:
                when = f"estimated start {format_when(estimated_start, now)}"
                if ending_job is not None and estimated_start > now:
                    when += f" when job {ending_job} ends"
                parts.append(when)
        return "; ".join(parts)


_LABELS = {
    PendingReason.NO_CAPACITY: "Waiting for GPUs",
    PendingReason.NO_MATCHING_GPU: "No matching GPU",
    PendingReason.NODES_UNAVAILABLE: "Its nodes are unavailable",
    PendingReason.NODE_CONSTRAINTS: "Node requirements not met",
    PendingReason.QUOTA: "Over quota",
    PendingReason.BUDGET: "Budget exhausted",
    PendingReason.WAITING_FOR_GANG: "Waiting for a gang",
    PendingReason.BLOCKED_BY_RESERVATION: "Blocked by a reservation",
    PendingReason.WAITING_IN_QUEUE: "Waiting in queue",
    PendingReason.PREEMPTING: "Preempting",
    PendingReason.INVALID_REQUEST: "Invalid request",
    PendingReason.DEPENDENCY: "Waiting for a dependency",
}

_HEADLINES = {
    PendingReason.NO_CAPACITY: "Waiting for {what}",
    PendingReason.NO_MATCHING_GPU: "No GPU in this pool can ever run it: {detail}",
    PendingReason.NODES_UNAVAILABLE: (
        "The GPUs that can run it are out of service for now ({detail}); it waits for them"
    ),
    PendingReason.NODE_CONSTRAINTS: "No node meets the job's node requirements: {detail}",
    PendingReason.QUOTA: "Held by your project's quota: {detail}",
    PendingReason.BUDGET: (
        "Your project's budget is used up; it will start once the budget is raised or renewed"
    ),
    PendingReason.WAITING_FOR_GANG: "Waiting for {what} at the same time (all or nothing): {detail}",
    PendingReason.BLOCKED_BY_RESERVATION: "GPUs are free but held: {detail}",
    PendingReason.WAITING_IN_QUEUE: "Waiting for {what} behind earlier jobs: {detail}",
    PendingReason.PREEMPTING: "Starting soon: {detail}",
    PendingReason.INVALID_REQUEST: "This request cannot be scheduled: {detail}",
    PendingReason.DEPENDENCY: "{detail}",
}


def format_duration(seconds: float) -> str:
    """'45 s', '20 min', '2 h 30 min', '3 days 4 h': a span as a researcher reads it."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    minutes = round(s / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} days {hours} h" if hours else f"{days} days"


def format_when(ts: float, now: float) -> str:
    """'14:05 UTC (in 25 min)'; the clock time is UTC because the core knows no time zone."""
    clock = datetime.fromtimestamp(ts, UTC).strftime("%H:%M UTC")
    wait = max(0.0, ts - now)
    if wait < 60:
        rel = "now"
    elif wait < 3600:
        rel = f"in {round(wait / 60)} min"
    elif wait < 48 * 3600:
        rel = f"in {wait / 3600:.1f} h"
    else:
        rel = f"in {wait / 86400:.1f} days"
        clock = datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"{clock} ({rel})" if rel != "now" else "now"
