"""The Redis cache backend keeps one client per connection pool (portal/cache.py)."""

from __future__ import annotations

import threading
import uuid

from django.core.cache import cache, caches

from portal.cache import RedisCache


def test_the_default_cache_reuses_its_redis_client() -> None:
    backend = caches["default"]
    assert isinstance(backend, RedisCache)
    first = backend._cache.get_client("a", write=True)
    assert backend._cache.get_client("b") is first  # one server: reads and writes share it


def test_a_shared_client_serves_concurrent_threads() -> None:
    """Each command borrows its own connection, so threads sharing the client see their own
    answers (Django's cache is per thread; the client is shared within a pool)."""
    client = caches["default"]._cache.get_client(None, write=True)
    prefix = f"cache-test-{uuid.uuid4().hex}"
    wrong: list[str] = []

    def worker(n: int) -> None:
        for i in range(200):
            key = f"{prefix}:{n}:{i}"
            client.set(key, f"{n}:{i}", ex=30)
            if client.get(key) != f"{n}:{i}".encode():
                wrong.append(key)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
    cache.set("cache-test-roundtrip", {"a": 1}, 30)
    assert cache.get("cache-test-roundtrip") == {"a": 1}
