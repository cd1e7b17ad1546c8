"""The Redis cache backend: JSON, never pickle; one client object per connection pool.

Django's Redis backend pickles every value that is not an int, and unpickles whatever it reads:
whoever can write to Redis could run code in every web process. `JsonSerializer` stores JSON
(bytes as themselves, behind their own tag), and a value in any other form (a pickle planted
under a cache key) reads as a miss, logged, never unpickled.

Django's `RedisCacheClient.get_client` builds a new `redis.Redis` around the pool on every cache
call; building one (its response-callback table) costs more CPU than the round trip it wraps
(about 0.15 ms, several times per request). A `redis.Redis` is safe to share: each command
borrows a connection from the pool, so the client per pool is built once and kept.

Fast path, justified by `bench.fast_paths` (docs/benchmarks.md, "Fast paths: kept or removed
(issue 26)": a get and a set 2.2x as fast as through Django's `RedisCache` with the same
serializer) and `bench.agent_requests`.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import redis
from django.core.cache.backends import redis as django_redis

log = logging.getLogger(__name__)

_JSON, _BYTES = b"j:", b"b:"


class JsonSerializer:
    """Cache values as JSON (tuples come back as lists, dict keys as strings); ints stay bare
    so that INCR works on them, as Django's own serializer keeps them."""

    def dumps(self, obj: Any) -> bytes | int:
        if type(obj) is int:
            return obj
        if isinstance(obj, bytes):
            return _BYTES + obj
        return _JSON + json.dumps(obj, separators=(",", ":")).encode()

    def loads(self, data: bytes) -> Any:
        try:
            return int(data)
        except ValueError:
            pass
        if data.startswith(_JSON):
            return json.loads(data[len(_JSON) :])
        if data.startswith(_BYTES):
            return bytes(data[len(_BYTES) :])
        log.warning("cache: a value in an unknown form (not JSON) was ignored")
        return None


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
    """`django.core.cache.backends.redis.RedisCache` with `ReusedClientRedisCacheClient` and
    `JsonSerializer` (whatever the settings say: pickle is never an option)."""

    def __init__(self, server: str, params: dict[str, Any]) -> None:
        options = {**params.get("OPTIONS", {}), "serializer": JsonSerializer}
        super().__init__(server, {**params, "OPTIONS": options})
        self._class = ReusedClientRedisCacheClient
