"""Redis commands sent once the current transaction commits, all of them in one round trip.

A submit publishes its push message (`portal.push`) and asks for a scheduling cycle
(`scheduler.cycle_requests`) after it commits: two commands on the cache's Redis, which cost
two round trips when each sends its own. Commands queued here while a transaction is open go
out together on commit, pipelined (no MULTI: each stands alone, as when sent one by one), in
the order queued; each caller's `on_answers` then reads its own answers.

Commands queued inside a savepoint are dropped with it when it rolls back, exactly as Django
drops the `on_commit` hooks registered there: a batch belongs to one savepoint (or to the
transaction itself), and its hook is an ordinary `on_commit` hook registered there. Outside a
transaction the commands are sent at once.

Fast path, justified by `bench.submit_cost` (a round trip less per submit). Callers use it
only where the cache is Redis (`redis_cache()`); elsewhere they keep Django's cache API.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import redis
from django.core.cache import caches
from django.core.cache.backends.redis import RedisCache
from django.db import transaction

Command = tuple[Any, ...]  # a Redis command and its arguments, as `execute_command` takes them
_BATCHES = "_redis_after_commit"  # on the database connection: its batches by savepoint


def redis_cache() -> RedisCache | None:
    """The default cache, where it is Redis; None elsewhere (the embedded file cache)."""
    cache = caches["default"]
    return cache if isinstance(cache, RedisCache) else None


class _Entry:
    __slots__ = ("commands", "on_answers", "on_error")

    def __init__(
        self,
        commands: Sequence[Command],
        on_answers: Callable[[list[Any]], None] | None,
        on_error: Callable[[redis.RedisError], None] | None,
    ) -> None:
        self.commands = commands
        self.on_answers = on_answers
        self.on_error = on_error


class _Batch:
    def __init__(self, cache: RedisCache) -> None:
        self.cache = cache
        self.entries: list[_Entry] = []
        self.hook: Callable[[], None] | None = None  # its `on_commit` hook, when it has one

    def send(self) -> None:
        """One pipelined round trip; each entry's answers (or the error) to its callback."""
        pipe = self.cache._cache.get_client(None, write=True).pipeline(transaction=False)
        for entry in self.entries:
            for command in entry.commands:
                pipe.execute_command(*command)
        try:
            answers = pipe.execute()
        except redis.RedisError as exc:
            for entry in self.entries:
                if entry.on_error is None:
                    raise
                entry.on_error(exc)
            return
        start = 0
        for entry in self.entries:
            end = start + len(entry.commands)
            if entry.on_answers is not None:
                entry.on_answers(answers[start:end])
            start = end


def after_commit(
    cache: RedisCache,
    commands: Sequence[Command],
    *,
    on_answers: Callable[[list[Any]], None] | None = None,
    on_error: Callable[[redis.RedisError], None] | None = None,
) -> None:
    """Send `commands` on `cache`'s Redis once the current transaction commits (at once outside
    one), with every other caller's commands of this transaction and savepoint. `on_answers`
    gets their answers, in order; a Redis error goes to `on_error`, or is raised without it."""
    entry = _Entry(commands, on_answers, on_error)
    conn = transaction.get_connection()
    if not conn.in_atomic_block:
        batch = _Batch(cache)
        batch.entries.append(entry)
        batch.send()
        return
    batches: dict[tuple[str, ...], _Batch] = conn.__dict__.setdefault(_BATCHES, {})
    where = tuple(conn.savepoint_ids)
    found = batches.get(where)
    # A batch whose hook is gone was sent (committed) or dropped (rolled back): start another.
    if (
        found is not None
        and found.cache is cache
        and any(hook is found.hook for _, hook, _ in conn.run_on_commit)
    ):
        batch = found
    else:
        live = {id(hook) for _, hook, _ in conn.run_on_commit}
        for key in [k for k, b in batches.items() if id(b.hook) not in live]:
            del batches[key]  # sent, or dropped with a savepoint: forget it
        batch = batches[where] = _Batch(cache)

        def send(batch: _Batch = batch) -> None:
            if batches.get(where) is batch:
                del batches[where]
            batch.send()

        batch.hook = send
        conn.on_commit(send)
    batch.entries.append(entry)
