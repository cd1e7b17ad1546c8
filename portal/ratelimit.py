"""A fixed-window rate limit for plain Django views (DRF views use DRF's throttles)."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.core.cache import cache
from django.http import HttpRequest, HttpResponse, JsonResponse

PERIODS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hour": 3600, "d": 86400, "day": 86400}


def parse_rate(rate: str) -> tuple[int, int]:
    """'120/min' -> (120, 60)."""
    count, _, period = rate.partition("/")
    return int(count), PERIODS[period]


def ratelimited(
    scope: str, rate: str
) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    limit, period = parse_rate(rate)

    def decorator(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            window = int(time.time() // period)
            who = request.META.get("REMOTE_ADDR") or "-"
            key = f"rl:{scope}:{who}:{window}"
            cache.add(key, 0, timeout=period + 1)
            try:
                count = cache.incr(key)
            except ValueError:
                count = 1
            if count > limit:
                response = JsonResponse(
                    {"detail": f"Rate limit of {rate} exceeded; retry after the current window."},
                    status=429,
                )
                response["Retry-After"] = str(period - int(time.time()) % period)
                return response
            return view(request, *args, **kwargs)

        return wrapper

    return decorator
