"""Single-flight locks: Redis when configured, else the shared cache (the embedded default)."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

import redis
from django.conf import settings
from django.core.cache import cache as django_cache


@cache
def redis_client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


def lock_key(name: str) -> str:
    """Namespaced like the cache, so two deployments (or test runs) on one Redis never share."""
    prefix = settings.CACHES["default"].get("KEY_PREFIX", "")
    return f"{prefix}:lock:{name}" if prefix else f"lock:{name}"


def lock_clear(name: str) -> None:
    """Drop a lock whose holder died (operators and tests; the TTL does it otherwise)."""
    if settings.REDIS_URL:
        redis_client().delete(lock_key(name))
    else:
        django_cache.delete(lock_key(name))


@contextmanager
def single_flight(name: str, *, ttl: float) -> Iterator[bool]:
    """Yield True if this process holds `name` for up to `ttl` seconds, else False at once."""
    key = lock_key(name)
    if settings.REDIS_URL:
        lock = redis_client().lock(key, timeout=ttl, blocking=False)
        acquired = lock.acquire(blocking=False)
        try:
            yield bool(acquired)
        finally:
            if acquired:
                # It may have expired while we ran; then the next holder owns it.
                with contextlib.suppress(redis.exceptions.LockError):
                    lock.release()
        return
    token = secrets.token_hex(8)
    acquired = django_cache.add(key, token, timeout=ttl)
    try:
        yield acquired
    finally:
        if acquired and django_cache.get(key) == token:
            django_cache.delete(key)
