"""The Redis cache backend keeps one client per connection pool (foundation/cache.py)."""

from __future__ import annotations

import threading
import uuid

from django.core.cache import cache, caches

from foundation.cache import RedisCache


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


class _Planted:
    """A pickle that, once unpickled, creates a file: the proof that it ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (open, (self.path, "w"))


def test_the_cache_stores_json_and_never_pickle() -> None:
    backend = caches["default"]
    raw = backend._cache.get_client(None, write=True)
    key = f"cache-test-json-{uuid.uuid4().hex}"
    cache.set(key, {"gpus": [1, 2], "at": "2026-01-01T00:00:00"}, 30)
    stored = raw.get(backend.make_and_validate_key(key))
    assert stored.startswith(b"j:") and b"\x80" not in stored  # JSON, not a pickle
    assert cache.get(key) == {"gpus": [1, 2], "at": "2026-01-01T00:00:00"}
    cache.set(key, b"\x00\x01 raw bytes", 30)
    assert cache.get(key) == b"\x00\x01 raw bytes"
    cache.set(key, 41, 30)
    assert cache.incr(key) == 42  # ints stay bare, so INCR still works


def test_a_pickle_planted_in_redis_is_never_unpickled_by_the_web_process(
    tmp_path, team, fleet
) -> None:
    """Whoever reaches Redis plants a pickle under the key the submit form reads: the page
    still answers, and the pickle never runs."""
    import pickle

    from django.test import Client

    from scheduler.estimates import AVAILABILITY_KEY

    proof = tmp_path / "pwned"
    backend = caches["default"]
    raw = backend._cache.get_client(None, write=True)
    raw.set(backend.make_and_validate_key(AVAILABILITY_KEY), pickle.dumps(_Planted(str(proof))))
    client = Client()
    client.force_login(team["member"])
    page = client.get("/jobs/new/")
    assert page.status_code == 200
    assert b"H100-80GB-SXM" in page.content  # computed anew, not read from the planted value
    assert not proof.exists()
