"""Probes for load balancers and orchestrators.

`/healthz`: the process is up and serving (no dependency is touched, so a database outage does
not get every web process restarted). `/readyz`: the database, the cache (Redis) and the Celery
broker answer; 503 naming what does not, so the balancer stops sending traffic here.
"""

from __future__ import annotations

import time

from django.core.cache import cache
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from foundation.db import database_round_trip


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def _database() -> None:
    # A round trip, asked for here: the connection's own health check (`is_usable`) no longer
    # makes one on PostgreSQL (foundation/db_backends/postgresql), and readiness means the server
    # answers now. A connection the server has ended is replaced first, as in any request.
    database_round_trip()


def _cache() -> None:
    key = "readyz:probe"
    cache.set(key, "1", timeout=10)
    if cache.get(key) != "1":
        raise RuntimeError("the cache did not return what was written")


def _broker() -> None:
    from celery import current_app

    with current_app.connection_for_write() as conn:  # the broker as the workers are configured
        conn.ensure_connection(max_retries=1, timeout=2)


CHECKS = {"database": _database, "cache": _cache, "broker": _broker}


@never_cache
@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    results: dict[str, dict[str, object]] = {}
    for name, check in CHECKS.items():
        started = time.perf_counter()
        try:
            check()
        except Exception as exc:
            results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
        else:
            results[name] = {"ok": True, "ms": round((time.perf_counter() - started) * 1000, 1)}
    ready = all(r["ok"] for r in results.values())
    return JsonResponse(
        {"status": "ready" if ready else "not ready", "checks": results},
        status=200 if ready else 503,
    )
