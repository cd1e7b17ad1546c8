"""Fixed-window rate limits: one cache round trip per check, exact under concurrency.

`window_hit` counts a hit in the current window with INCRBY and EXPIRE in one Lua script (one
command, atomic as a MULTI block, whatever the number of windows), so concurrent requests never
lose each other's hits (DRF's stock throttles keep a list of timestamps with a read and a
write: two round trips, and racing requests overwrite each other). The DRF throttles below and
`ratelimited` (plain Django views) both use it.

Fast path (the script): `bench.fast_paths` (a submit's two windows 4.2x as fast as Django's
cache API, `add` then `incr` per window) and `bench.submit_cost`, where every submit counts two
windows; as a
MULTI/EXEC pipeline of INCRBY and EXPIRE per window (six commands to pack and parse), the
count cost a submit 0.32 M instructions, as one script call 0.20 M.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.core.cache import caches
from django.core.cache.backends.redis import RedisCache
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.shortcuts import render
from redis.commands.core import Script
from rest_framework.request import Request
from rest_framework.throttling import (
    AnonRateThrottle,
    ScopedRateThrottle,
    SimpleRateThrottle,
    UserRateThrottle,
)

clock = time.time  # tests pin it to stay inside one window

PERIODS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hour": 3600, "d": 86400, "day": 86400}


def parse_rate(rate: str) -> tuple[int, int]:
    """'120/min' -> (120, 60)."""
    count, _, period = rate.partition("/")
    return int(count), PERIODS[period]


def window_of(key: str, period: int, *, now: float | None = None) -> tuple[str, int]:
    """The cache key counting `key`'s hits in the current window, and seconds until it ends."""
    now = clock() if now is None else now
    return f"rl:{key}:{int(now // period)}", max(1, math.ceil(period - now % period))


# KEYS: the windows' keys; ARGV: per key, the hits to count and the window's time to live.
_HIT = Script(
    None,  # type: ignore[arg-type]  # a client is given per call; bytes need none to encode
    b"""
local counts = {}
for i, key in ipairs(KEYS) do
  counts[i] = redis.call('INCRBY', key, ARGV[2 * i - 1])
  redis.call('EXPIRE', key, ARGV[2 * i])
end
return counts
""",
)


def _hit_on_redis(cache: RedisCache, hits: list[tuple[str, int, int]]) -> list[int]:
    """Count `(window key, hits, time to live)` on Redis, in one round trip; the counts."""
    keys = [cache.make_and_validate_key(window_key) for window_key, _, _ in hits]
    args = [value for _, amount, ttl in hits for value in (amount, ttl)]
    client = cache._cache.get_client(keys[0], write=True)  # the cache's one server
    return [int(count) for count in _HIT(keys=keys, args=args, client=client)]


def window_hit(
    key: str, period: int, *, now: float | None = None, amount: int = 1
) -> tuple[int, int]:
    """Count `amount` hits (one by default) for `key` in the current `period`-second window.

    Returns (hits in this window so far, seconds until the window ends). One round trip on Redis.
    """
    window_key, retry_after = window_of(key, period, now=now)
    cache = caches["default"]  # the backend itself, not the proxy, to reach its Redis client
    if isinstance(cache, RedisCache):
        (count,) = _hit_on_redis(cache, [(window_key, amount, period + 1)])
        return count, retry_after
    # Other backends (the embedded file cache): add then incr, atomic enough for one host.
    cache.add(window_key, 0, timeout=period + 1)
    try:
        return cache.incr(window_key, amount), retry_after
    except ValueError:  # expired between the two calls
        cache.set(window_key, amount, timeout=period + 1)
        return amount, retry_after


def window_hits(windows: list[tuple[str, int]]) -> list[tuple[int, int]]:
    """`window_hit` (one hit) for each `(key, period)`, in one round trip on Redis."""
    if len(windows) == 1:
        return [window_hit(*windows[0])]
    cache = caches["default"]
    if not windows or not isinstance(cache, RedisCache):
        return [window_hit(key, period) for key, period in windows]
    now = clock()
    hits, waits = [], []
    for key, period in windows:
        window_key, retry_after = window_of(key, period, now=now)
        hits.append((window_key, 1, period + 1))
        waits.append(retry_after)
    counts = _hit_on_redis(cache, hits)
    return list(zip(counts, waits, strict=True))


class FixedWindowMixin(SimpleRateThrottle):
    """A DRF throttle counting in fixed windows (`window_hit`): 429 with Retry-After when over."""

    retry_after: int | None = None
    num_requests: int | None  # set from the rate by DRF's __init__ (or per view, when scoped)
    duration: int | None

    def hit_window(self, request: Request, view: Any) -> tuple[str, int] | None:
        """The key and period this request counts in, or None where it is not limited."""
        if self.rate is None:
            return None
        key = self.get_cache_key(request, view)
        if key is None or self.num_requests is None or self.duration is None:
            return None
        return key, self.duration

    def settle(self, count: int, retry_after: int) -> bool:
        """Whether `count` hits in the window are allowed (its end kept for `wait`)."""
        self.retry_after = retry_after
        return self.num_requests is None or count <= self.num_requests

    def allow_request(self, request: Request, view: Any) -> bool:
        window = self.hit_window(request, view)
        if window is None:
            return True
        return self.settle(*window_hit(*window))

    def wait(self) -> float | None:
        return self.retry_after


class FixedWindowAnonThrottle(FixedWindowMixin, AnonRateThrottle):
    """Anonymous requests per client address."""


class FixedWindowUserThrottle(FixedWindowMixin, UserRateThrottle):
    """Authenticated requests per user (anonymous ones per address)."""


class FixedWindowScopedThrottle(FixedWindowMixin, ScopedRateThrottle):
    """Per user and the view's `throttle_scope` (submit, dry run): the expensive endpoints."""

    def hit_window(self, request: Request, view: Any) -> tuple[str, int] | None:
        self.scope = getattr(view, self.scope_attr, None)
        if not self.scope:
            return None
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return super().hit_window(request, view)


class OneRoundTripThrottlesMixin:
    """For API views: the fixed-window throttles of a request (the user's limit and the
    view's scope) count their hits in one Redis round trip, not one each. Every throttle
    counts, as DRF's `check_throttles` has them all count; over any limit, a 429 with the
    longest wait. (`bench.submit_cost`: every submission passes two limits.)"""

    def check_throttles(self, request: Request) -> None:
        durations = []
        windowed: list[tuple[FixedWindowMixin, tuple[str, int]]] = []
        for throttle in self.get_throttles():  # type: ignore[attr-defined]
            # (a throttle that decides otherwise, as the agents' does, is asked as DRF asks)
            if (
                isinstance(throttle, FixedWindowMixin)
                and type(throttle).allow_request is FixedWindowMixin.allow_request
            ):
                window = throttle.hit_window(request, self)
                if window is not None:
                    windowed.append((throttle, window))
            elif not throttle.allow_request(request, self):
                durations.append(throttle.wait())
        hits = window_hits([window for _, window in windowed])
        for (throttle, _), (count, retry_after) in zip(windowed, hits, strict=True):
            if not throttle.settle(count, retry_after):
                durations.append(throttle.wait())
        if durations:
            waits = [d for d in durations if d is not None]
            self.throttled(request, max(waits, default=None))  # type: ignore[attr-defined]


def ratelimited(
    scope: str,
    rate: str | Callable[[], str],
    *,
    methods: tuple[str, ...] | None = None,
    per_user: bool = False,
    page: bool = False,
) -> Callable[[Callable[..., HttpResponseBase]], Callable[..., HttpResponseBase]]:
    """A fixed-window limit for a plain Django view: per client address (or per signed-in user
    with `per_user`), counting only `methods` when given. Over the limit: 429 with Retry-After,
    as JSON, or as the error page for pages (`page`). `rate` may be a callable, read at each
    request (a setting that tests and operators can change)."""

    def decorator(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if methods is not None and request.method not in methods:
                return view(request, *args, **kwargs)
            current = rate() if callable(rate) else rate
            limit, period = parse_rate(current)
            user = getattr(request, "user", None)
            if per_user and user is not None and user.is_authenticated:
                who = f"user:{user.pk}"
            else:
                who = request.META.get("REMOTE_ADDR") or "-"
            count, retry_after = window_hit(f"{scope}:{who}", period)
            if count > limit:
                return too_many(request, current, retry_after, page=page)
            return view(request, *args, **kwargs)

        return wrapper

    return decorator


def too_many(request: HttpRequest, rate: str, retry_after: int, *, page: bool) -> HttpResponse:
    message = f"Rate limit of {rate} exceeded; try again in {retry_after} s."
    response: HttpResponse
    if page:
        response = render(request, "error.html", {"status": 429, "message": message}, status=429)
    else:
        response = JsonResponse({"detail": message}, status=429)
    response["Retry-After"] = str(retry_after)
    return response


def hits_allowed(key: str, rate: str, hits: int = 1) -> tuple[bool, int]:
    """Count `hits` (an array job's shards, say) against `rate` for `key`; (allowed, retry_after).

    A request whose hits would pass the limit is refused and counted, so a burst of large
    requests cannot slip through one at a time."""
    limit, period = parse_rate(rate)
    count, retry_after = window_hit(key, period, amount=max(1, hits))
    return count <= limit, retry_after


def scope_allows(*, scope: str, user_pk: object, hits: int = 1) -> tuple[bool, int]:
    """Count `hits` against the API's scoped limit `scope` (submit, dry_run) for this user, in
    the very window `FixedWindowScopedThrottle` counts, so the web form and the API share one
    budget and an array job counts once per shard. Returns (allowed, seconds to retry)."""
    rate = FixedWindowScopedThrottle.THROTTLE_RATES.get(scope)  # what the API's throttle reads
    if not rate:
        return True, 0
    limit, period = parse_rate(rate)
    key = ScopedRateThrottle.cache_format % {"scope": scope, "ident": user_pk}
    count, retry_after = window_hit(key, period, amount=max(1, hits))
    return count <= limit, retry_after
