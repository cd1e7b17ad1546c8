"""Redis commands sent once the current transaction commits, in one round trip where they
are queued one after another.

A submit publishes its push message (`foundation.push`) and asks for a scheduling cycle
(`scheduler.cycle_requests`) after it commits: two commands on the cache's Redis, which cost
two round trips when each sends its own. Commands queued here go out pipelined (no MULTI: each
stands alone, as when sent one by one) by one `on_commit` hook, in the order queued; each
caller's `on_answers` then reads its own answers.

A batch is exactly where its hooks would have been: commands join the batch only while it is
the last `on_commit` hook registered, in the same savepoint. Any other hook registered in
between (say, dropping cached versions that a push message must not overtake) starts a new
batch after it, so every command still runs after the hooks registered before it and before
those registered after it; a savepoint that rolls back drops its batch with its other hooks.
Outside a transaction the commands are sent at once.

Fast path, justified by `bench.fast_paths` (a submit's push message and cycle request 1.9x as
fast as a hook each: one round trip for three) and `bench.submit_cost`. Callers use it
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
    """The commands of one `on_commit` hook; the hook itself (called: sent)."""

    def __init__(self, cache: RedisCache) -> None:
        self.cache = cache
        self.entries: list[_Entry] = []

    def __call__(self) -> None:
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
    one), with the commands queued just before them if nothing else was registered to run on
    commit in between. `on_answers` gets their answers, in order; a Redis error goes to
    `on_error`, or is raised without it."""
    entry = _Entry(commands, on_answers, on_error)
    conn = transaction.get_connection()
    if conn.in_atomic_block and conn.run_on_commit:
        savepoints, hook, _ = conn.run_on_commit[-1]
        if (
            isinstance(hook, _Batch)
            and hook.cache is cache
            and savepoints == set(conn.savepoint_ids)
        ):
            hook.entries.append(entry)
            return
    batch = _Batch(cache)
    batch.entries.append(entry)
    conn.on_commit(batch)  # outside a transaction: sent now
