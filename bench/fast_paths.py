"""Each fast path against the plain Django / DRF path it replaces, side by side in one process.

    .venv/bin/python -m bench.fast_paths [--nodes 1000] [--jobs 10000] [--rounds 9] [--only NAME]

Issue 26 keeps a fast path only where it is at least 1.5x its generic path on its own path.
Every pair runs alternating (fast, generic, fast, generic, ...) in `--rounds` rounds; each
round times enough calls of one side to last about `--budget-ms` and keeps the mean wall time
per call (Redis and PostgreSQL answer on the wall clock, not in this process's CPU). The table
gives the medians of the rounds, generic / fast as the ratio of the medians and, in brackets,
the lowest and highest ratio of one round's pair.

- `cache`: `foundation.cache.RedisCache` (one `redis.Redis` per pool) against Django's
  `RedisCache` with the same JSON serializer: a `get` of a present key and a `set`.
- `rate gate`: `foundation.ratelimit.window_hits` (one Lua call counting a submit's two windows)
  against Django's cache API (`add` then `incr` per window, the file cache's path).
- `after-commit batch`: a submit's after-commit Redis commands (its push message, its cycle
  request's SET and SET NX) in one pipelined `on_commit` hook against a hook each (the push
  message's own pipeline, then `request_cycle`'s `cache.set` and `cache.add`).
- `plain parser`: `SUBMIT_PARSER.parse` against `JobCreateSerializer(data=...).is_valid()`.
- `database health check`: the portal backend's `is_usable` (no round trip) against Django's
  (`SELECT 1`), on an open idle connection (the first query of every request).
- `insert_instances`: a submit's job, then its event and audit event (one statement per
  call) against `bulk_create` (one per group).
- `compiled read`: every `CompiledQuery` site, its `rows(...)` against the queryset built,
  compiled and read the ORM's way (`values_list` rows made into the same row type), on the
  `bench.cycle_scale` fleet (`--nodes`, `--jobs`) with parameters of the sizes the callers pass.

orjson rendering and parsing are `bench.json_cost`; `insert_rows` / `bulk_update_rows` are
`bench.bulk_rows`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import statistics
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from bench import command_line, markdown_table, write_section
from bench.django_env import setup, teardown

COMPILED_MODULES = (
    "portal.selectors",
    "scheduler.cycle.reads",
    "scheduler.selectors",
    "scheduler.transitions",
    "scheduler.images",
    "scheduler.nodes.assignments",
    "scheduler.nodes.reports",
    "scheduler.nodes.tokens",
    "billing.admission",
    "billing.selectors",
)


def per_call(call: Callable[[], Any], budget_s: float) -> tuple[float, int]:
    """Seconds per call, and how many calls make `budget_s` (measured on a first call)."""
    started = time.perf_counter()
    call()
    first = time.perf_counter() - started
    return first, max(1, min(2000, int(budget_s / max(first, 1e-7))))


def side_by_side(
    fast: Callable[[], Any], generic: Callable[[], Any], rounds: int, budget_s: float
) -> tuple[float, float, float, float]:
    """Median seconds per call of each, and the lowest and highest per-round ratio."""
    fast()
    generic()  # warm both (a compiled query compiles, the serializer builds its fields)
    _, n_fast = per_call(fast, budget_s)
    _, n_generic = per_call(generic, budget_s)
    fast_t, generic_t = [], []
    for _ in range(rounds):
        for call, n, out in ((fast, n_fast, fast_t), (generic, n_generic, generic_t)):
            started = time.perf_counter()
            for _ in range(n):
                call()
            out.append((time.perf_counter() - started) / n)
    ratios = [g / f for f, g in zip(fast_t, generic_t, strict=True)]
    return statistics.median(fast_t), statistics.median(generic_t), min(ratios), max(ratios)


def _cache_pair() -> list[tuple[str, Callable[[], Any], Callable[[], Any]]]:
    from django.conf import settings
    from django.core.cache.backends.redis import RedisCache as DjangoRedisCache

    from foundation.cache import JsonSerializer, RedisCache

    params = dict(settings.CACHES["default"])
    location = params.pop("LOCATION")
    params["KEY_PREFIX"] = "bench-fast-paths"
    ours = RedisCache(location, params)
    theirs = DjangoRedisCache(
        location, {**params, "OPTIONS": {**params.get("OPTIONS", {}), "serializer": JsonSerializer}}
    )
    value = {"node": 17, "version": 42, "state": "ready"}
    ours.set("k", value)

    def both(cache: Any) -> Callable[[], Any]:
        def call() -> Any:
            cache.get("k")
            cache.set("k2", value, 60)

        return call

    return [("cache: get + set", both(ours), both(theirs))]


def _rate_gate_pair() -> list[tuple[str, Callable[[], Any], Callable[[], Any]]]:
    from django.core.cache import caches

    from foundation import ratelimit

    cache = caches["default"]
    windows = [("throttle_user_1", 60), ("throttle_submit_1", 3600)]

    def lua() -> Any:
        return ratelimit.window_hits(windows)

    def cache_api() -> Any:  # what the file cache gets: add, then incr, per window
        out = []
        for key, period in windows:
            window_key, _ = ratelimit.window_of(key, period)
            cache.add(window_key, 0, timeout=period + 1)
            out.append(cache.incr(window_key, 1))
        return out

    return [("rate gate: a submit's two windows", lua, cache_api)]


def _after_commit_pair() -> list[tuple[str, Callable[[], Any], Callable[[], Any]]]:
    from django.core.cache import cache
    from django.db import transaction

    from foundation import push
    from scheduler import cycle_requests

    # a cycle counts as queued all along, so neither side queues a task
    cache.set(cycle_requests.CYCLE_REQUESTED, 1, timeout=600)
    encoded = [(push.project_channel(1), b'{"k":"jobs","ids":[1]}')]

    def batched() -> None:  # what a submit does after its writes
        with transaction.atomic():
            push.jobs_changed([(1, 1)])
            cycle_requests.request_cycle_on_commit()

    def own_hooks() -> None:  # each its own hook: a pipelined PUBLISH, cache.set, cache.add
        with transaction.atomic():
            transaction.on_commit(lambda: push._send(encoded))
            transaction.on_commit(cycle_requests.request_cycle)

    return [("after-commit batch: a submit's push + cycle request", batched, own_hooks)]


def _plain_parser_pair() -> list[tuple[str, Callable[[], Any], Callable[[], Any]]]:
    from scheduler.api.jobs import SUBMIT_PARSER, JobCreateSerializer

    bodies = {
        "small": {"project": "p0", "name": "train", "command": "python train.py", "gpus": 4},
        "full": {
            "project": "p0",
            "name": "sweep",
            "command": "python sweep.py",
            "gpus": 2,
            "precisions": ["bf16"],
            "priority": "high",
            "preemptible": True,
            "time_limit_s": 3600,
            "runtime_estimate_s": None,
            "env": {"LR": "0.001", "EMPTY": ""},
            "secret_env": {"WANDB_KEY": "k"},
            "checkpoint_dir": "/ckpt",
            "shard_count": 10,
        },
    }
    pairs = []
    for label, body in bodies.items():
        assert SUBMIT_PARSER.parse(body) is not None, body

        def serializer(body: dict[str, Any] = body) -> Any:
            create = JobCreateSerializer(data=body)
            create.is_valid(raise_exception=True)
            return create.validated_data

        pairs.append(
            (f"plain parser: {label} submission", lambda b=body: SUBMIT_PARSER.parse(b), serializer)
        )
    return pairs


def _health_check_pair() -> list[tuple[str, Callable[[], Any], Callable[[], Any]]]:
    from django.db import connections
    from django.db.backends.postgresql.base import DatabaseWrapper as DjangoWrapper

    from foundation.db_backends.postgresql.base import DatabaseWrapper

    connection = connections["default"]
    connection.ensure_connection()
    assert isinstance(connection, DatabaseWrapper)
    return [
        (
            "database health check (is_usable)",
            lambda: connection.is_usable(),
            lambda: DjangoWrapper.is_usable(connection),
        )
    ]


def _insert_instances_pairs() -> list[tuple[str, Callable[[], Any], Callable[[], Any]]]:
    from django.db import transaction

    from foundation.db import insert_instances
    from portal.audit import audit_event
    from portal.models import Project, User
    from scheduler.models import Job, JobEvent

    user = User.objects.get(email="bench@example.org")
    project = Project.objects.get(slug="p0")
    job = Job.objects.filter(project=project).first()

    def groups() -> tuple[list[Any], list[Any], list[Any]]:
        new = Job(project=project, submitted_by=user, name="j", command="true", gpus=1)
        event = JobEvent(job=job, to_state="pending", actor=user, actor_label="u", reason="r")
        audit = audit_event(actor=user, action="job.submit", target=job, project=project)
        return [new], [event], [audit]

    def ours() -> None:
        new, events, audits = groups()
        with transaction.atomic():
            insert_instances(new)
            insert_instances(events, audits)
            transaction.set_rollback(True)

    def django() -> None:
        new, events, audits = groups()
        with transaction.atomic():
            for group in (new, events, audits):
                type(group[0]).objects.bulk_create(group)
            transaction.set_rollback(True)

    return [("insert_instances: a submit's job, event, audit", ours, django)]


def _sample(name: str, ids: dict[str, Any]) -> Any:
    """A value of the kind the callers pass for a `build` parameter called `name`."""
    from django.utils import timezone

    now = timezone.now()
    if name in ("since", "cutoff"):
        return now - timedelta(hours=1)
    if name == "now":
        return now
    if name in ("ids", "gpu_ids", "job_ids", "project_ids"):
        return ids[name]
    if name in ("token_hash",):
        return "0" * 64
    if name == "name":
        return "H100-80GB-SXM"
    if name == "slug":
        return "p0"
    return ids["one"][name]


def _compiled_pairs() -> list[tuple[str, Callable[[], Any], Callable[[], Any]]]:
    from django.db import transaction

    from foundation.db import CompiledQuery
    from portal.models import Project, User
    from scheduler.models import Allocation, Gpu, Job, JobState

    alloc = Allocation.objects.filter(ended_at__isnull=True).select_related("gpu").first()
    assert alloc is not None, "the fleet has running work"
    queued = list(Job.objects.filter(state=JobState.QUEUED).values_list("pk", flat=True)[:200])
    ids = {
        "project_ids": list(Project.objects.values_list("pk", flat=True)),
        "gpu_ids": list(Gpu.objects.values_list("pk", flat=True)[:64]),  # a plan's touched GPUs
        "job_ids": queued,
        "ids": [alloc.job_id],  # the jobs one agent sync reports on
        "one": {
            "pk": alloc.job_id,
            "job_id": alloc.job_id,
            "node_id": alloc.gpu.node_id,
            "project_id": alloc.job.project_id,
            "user_id": User.objects.get(email="bench@example.org").pk,
            "attempt": 1,
        },
    }
    pairs = []
    for module_name in COMPILED_MODULES:
        module = importlib.import_module(module_name)
        for attr, query in sorted(vars(module).items()):
            if not isinstance(query, CompiledQuery):
                continue
            build = query._build
            params = {name: _sample(name, ids) for name in inspect.signature(build).parameters}
            make = getattr(query._row, "_make", query._row)

            # the reads that lock run in a transaction (as their callers do), the others not
            locks = build(**params).query.select_for_update
            block = transaction.atomic if locks else contextlib.nullcontext

            def compiled(query: Any = query, params: dict[str, Any] = params, block=block) -> Any:
                with block():
                    return query.rows(**params)

            def orm(
                build: Any = build, params: dict[str, Any] = params, make: Any = make, block=block
            ) -> Any:
                with block():
                    return [make(row) for row in build(**params)]

            label = f"compiled read: {module_name.split('.', 1)[1]}.{attr}"
            pairs.append((label, compiled, orm))
    return pairs


SECTIONS: dict[str, Callable[[], list[tuple[str, Callable[[], Any], Callable[[], Any]]]]] = {
    "cache": _cache_pair,
    "rate_gate": _rate_gate_pair,
    "after_commit": _after_commit_pair,
    "plain_parser": _plain_parser_pair,
    "health_check": _health_check_pair,
    "insert_instances": _insert_instances_pairs,
    "compiled": _compiled_pairs,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--budget-ms", type=float, default=40.0)
    parser.add_argument("--only", choices=sorted(SECTIONS), action="append")
    parser.add_argument("--reuse", action="store_true", help="the fleet an earlier run seeded")
    parser.add_argument("--no-docs", action="store_true", help="only print the table")
    args = parser.parse_args()

    from bench.django_env import reuse

    if not (args.reuse and reuse("fastpaths")):
        setup("fastpaths")
        from bench.cycle_scale import seed

        seed(args.nodes, args.jobs)
    rows = []
    for name in args.only or SECTIONS:
        for label, fast, generic in SECTIONS[name]():
            f, g, low, high = side_by_side(fast, generic, args.rounds, args.budget_ms / 1000)
            verdict = "kept" if g / f >= 1.5 else "below 1.5x"
            rows.append(
                [
                    label,
                    f"{f * 1e6:,.1f}",
                    f"{g * 1e6:,.1f}",
                    f"{g / f:.2f} ({low:.2f}–{high:.2f})",
                    verdict,
                ]
            )
            print(" | ".join(rows[-1]), flush=True)
    teardown()
    table = markdown_table(
        ["path", "fast µs per call", "generic µs per call", "generic / fast (rounds)", "≥ 1.5x"],
        rows,
    )
    body = (
        "### The latest run\n\n"
        f"`{command_line('bench.fast_paths')}` — each pair alternating in {args.rounds} rounds "
        f"of about {args.budget_ms:g} ms a side, wall time per call, medians; fleet of "
        f"{args.nodes} nodes and {args.jobs} jobs (`bench.cycle_scale`'s).\n\n" + table
    )
    print(table)
    if not args.no_docs:
        write_section("fast_paths", body)


if __name__ == "__main__":
    main()
