"""Agent requests in one process: each fast path of the agent API against the generic path.

    .venv/bin/python -m bench.agent_requests [--requests 1000] [--runs 5]

The two requests agents send most, an idle sync (`{"version": v}`, answered `unchanged`) and a
heartbeat (8 GPUs × 5 samples, as the agent sends every 5 s), through Django's test client:
URL routing, middleware, DRF, the view, the database and Redis, no HTTP server. Each variant
switches one fast path off for the generic code it stands in for:

- plain parsers (`scheduler.agent_api.fastparse`) → the DRF serializers;
- the Lua gate (`scheduler.agent_api.gate`: token, throttle and assignment version in one
  Redis round trip) → the same three answers one by one (the path other caches take);
- the cache client that is built once per pool (`foundation.cache.RedisCache`) → Django's own
  `django.core.cache.backends.redis.RedisCache`, which builds a client on every call.

Variants alternate within each run (so a noisy machine slows them alike); the table gives
the median over runs of the mean wall time per request, and each variant's ratio to the
shipped configuration. On PostgreSQL and Redis (`DATABASE_URL`, `REDIS_URL`); database
`<name>_agents`.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from bench import command_line, markdown_table, spread, write_section
from bench.django_env import setup, teardown

GPUS = 8
SAMPLES_PER_GPU = 5


def seed() -> tuple[str, list[str]]:
    """A node with 8 simulated H100s and its agent token; the GPUs' uuids."""
    from scheduler.models import Gpu, GpuModel, Pool
    from scheduler.nodes import node_issue_agent_token
    from scheduler.seed import catalog_seed, node_register_simulated

    catalog_seed()
    pool, _ = Pool.objects.get_or_create(name="default")
    node = node_register_simulated(
        name="bench-1",
        pool=pool,
        gpu_model=GpuModel.objects.get(name="H100-80GB-SXM"),
        gpu_count=GPUS,
        cpu_milli=64_000,
        memory_mib=512_000,
        state="ready",
    )
    uuids = list(Gpu.objects.filter(node=node).order_by("index").values_list("uuid", flat=True))
    return node_issue_agent_token(node=node), uuids


def heartbeat_body(uuids: list[str], samples_per_gpu: int = SAMPLES_PER_GPU) -> dict[str, Any]:
    return {
        "telemetry": [
            {
                "uuid": uuid,
                "utilization": 40.0 + i,
                "memory_used_mib": 1024 * i,
                "temperature_c": 55,
                "power_w": 310.5,
                "ecc_uncorrected": 0,
                "row_remap_pending": False,
                "xid_events": [],
                "throttle_reasons": [],
                "processes": [],
                "lost": False,
                "age_s": age,
            }
            for age in range(samples_per_gpu)
            for i, uuid in enumerate(uuids)
        ],
        "running": [],
    }


@contextlib.contextmanager
def patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


@contextlib.contextmanager
def shipped() -> Iterator[None]:
    yield


@contextlib.contextmanager
def serializers_only() -> Iterator[None]:
    from scheduler.agent_api import fastparse

    with (
        patched(fastparse, "idle_sync", lambda data: None),
        patched(fastparse, "plain_heartbeat", lambda data: None),
    ):
        yield


@contextlib.contextmanager
def no_lua_gate() -> Iterator[None]:
    from scheduler.agent_api import gate

    with patched(gate, "_in_one_round_trip", lambda *args: None):
        yield


@contextlib.contextmanager
def django_redis_client() -> Iterator[None]:
    from django.conf import settings
    from django.test import override_settings

    caches = {"default": {**settings.CACHES["default"]}}
    caches["default"]["BACKEND"] = "django.core.cache.backends.redis.RedisCache"
    with override_settings(CACHES=caches):
        yield


VARIANTS: list[tuple[str, Callable[[], contextlib.AbstractContextManager[None]]]] = [
    ("shipped (all fast paths)", shipped),
    ("DRF serializers instead of fastparse", serializers_only),
    ("three cache calls instead of the Lua gate", no_lua_gate),
    ("Django's RedisCache client instead of foundation.cache", django_redis_client),
]


def timed(send: Callable[[], Any], n: int) -> float:
    """Mean seconds per request over `n` requests (after a few to warm up)."""
    for _ in range(10):
        send()
    started = time.perf_counter()
    for _ in range(n):
        send()
    return (time.perf_counter() - started) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="per variant, request, run")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-docs", action="store_true", help="only print the table")
    parser.add_argument(
        "--shipped-only", action="store_true", help="only the shipped configuration"
    )
    args = parser.parse_args()
    variants = VARIANTS[:1] if args.shipped_only else VARIANTS
    setup("agents")
    try:
        from django.test.utils import setup_test_environment
        from rest_framework.test import APIClient

        setup_test_environment()  # the test client's host is allowed
        token, uuids = seed()
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
        version = client.post("/api/agent/v1/sync", {}, format="json").json()["version"]
        idle = {"version": version, "reports": []}
        beat = heartbeat_body(uuids)

        def sync() -> None:
            answer = client.post("/api/agent/v1/sync", idle, format="json")
            assert answer.status_code == 200, answer.content
            body = answer.json()
            if not body["unchanged"]:  # the version was forgotten (cache TTL): as an agent would
                idle["version"] = body["version"]

        def heartbeat() -> None:
            answer = client.post("/api/agent/v1/heartbeat", beat, format="json")
            assert answer.status_code == 200, answer.content

        from scheduler.agent_api.views import AgentThrottle

        results: dict[str, dict[str, list[float]]] = {
            name: {"sync": [], "heartbeat": []} for name, _ in variants
        }
        # the throttle counts as in production, with room for far more than an agent's share
        rates = {
            **AgentThrottle.THROTTLE_RATES,
            "agent": "100000000/min",
            "agent_heartbeat": "100000000/min",  # its own scope since the heartbeat throttle
        }
        with patched(AgentThrottle, "THROTTLE_RATES", rates):
            for _, variant in variants:  # a round to warm every path up, not recorded
                with variant():
                    timed(sync, 50)
                    timed(heartbeat, 20)
            for run in range(args.runs):
                for name, variant in variants:
                    with variant():
                        results[name]["sync"].append(timed(sync, args.requests))
                        results[name]["heartbeat"].append(timed(heartbeat, args.requests // 4))
                print(f"run {run + 1} of {args.runs} done")
    finally:
        teardown()
    base = {k: statistics.median(results[VARIANTS[0][0]][k]) for k in ("sync", "heartbeat")}
    rows = []
    for name, _ in variants:
        med = {k: statistics.median(results[name][k]) for k in ("sync", "heartbeat")}
        rows.append(
            [
                name,
                spread([v * 1e6 for v in results[name]["sync"]], 0),
                f"{med['sync'] / base['sync']:.2f}",
                spread([v * 1e6 for v in results[name]["heartbeat"]], 0),
                f"{med['heartbeat'] / base['heartbeat']:.2f}",
            ]
        )
    table = markdown_table(
        [
            "variant",
            "idle sync µs, median (min–max)",
            "× shipped",
            f"heartbeat ({GPUS * SAMPLES_PER_GPU} samples) µs, median (min–max)",
            "× shipped",
        ],
        rows,
    )
    print(table)
    if not args.no_docs and not args.shipped_only:
        write_section(
            "agent_requests",
            "## Agent requests: each fast path against the generic path\n\n"
            f"`{command_line('bench.agent_requests')}` — Django's test client in one process "
            "(routing, middleware, DRF, view, PostgreSQL and Redis; no HTTP server), an idle "
            f"sync answered `unchanged` and a heartbeat of {GPUS} GPUs × {SAMPLES_PER_GPU} "
            f"samples; {args.requests} syncs and {args.requests // 4} heartbeats per variant "
            f"and run, variants alternating; medians of {args.runs} runs of the mean wall "
            "time per request.\n\n" + table,
        )


if __name__ == "__main__":
    main()
