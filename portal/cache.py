"""The Redis cache backend, with one client object per connection pool instead of one per call.

Django's `RedisCacheClient.get_client` builds a new `redis.Redis` around the pool on every cache
call; building one (its response-callback table) costs more CPU than the round trip it wraps
(about 0.15 ms, several times per request). A `redis.Redis` is safe to share: each command
borrows a connection from the pool, so the client per pool is built once and kept.

Fast path, justified by `bench.agent_requests` (docs/benchmarks.md, "Agent requests"), which
times the agents' requests with Django's own `RedisCache` in its place.
"""

from __future__ import annotations

from typing import Any

import redis
from django.core.cache.backends import redis as django_redis


class ReusedClientRedisCacheClient(django_redis.RedisCacheClient):
    """Django's client, handing out one `redis.Redis` per connection pool."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._clients: dict[int, redis.Redis] = {}

    def get_client(self, key: Any = None, *, write: bool = False) -> redis.Redis:
        # The private helpers are Django's own (django-stubs leaves them out).
        index = self._get_connection_pool_index(write)  # type: ignore[attr-defined]
        client = self._clients.get(index)
        if client is None:
            pool = self._get_connection_pool(write)  # type: ignore[attr-defined]
            client = self._clients[index] = redis.Redis(connection_pool=pool)
        return client


class RedisCache(django_redis.RedisCache):
    """`django.core.cache.backends.redis.RedisCache` with `ReusedClientRedisCacheClient`."""

    def __init__(self, server: str, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._class = ReusedClientRedisCacheClient
