"""Pushed page updates: messages on Redis pub/sub channels, published after commit.

Pages learn that something changed from a server-sent event stream (`web/events.py`, served
by the async events service) instead of polling. A message says *what* changed, never the
new content: the page then fetches the partial it already knows how to fetch, through the same
views, permissions and templates as a poll. A lost message costs freshness, never
correctness: the stream's (re)connection refreshes every pushed part of the page once.

Channels (prefixed with the cache's key prefix, so two deployments or test runs on one Redis
never hear each other; pub/sub ignores Redis's database numbers):

- `…:push:p:<project id>`  `{"k": "jobs", "ids": [job ids]}`: jobs of the project changed
  state, queue position, pending reason or estimate, or were submitted (job lists, job pages);
- `…:push:j:<job id>`      `{"k": "logs", "job": <job id>, "last": <last chunk id>}` a log
  append (a page showing several jobs' logs, an array's, tells them apart by `job`), and
  `{"k": "telemetry"}` a heartbeat with samples of the job (published by the live store's
  write script, `monitoring/live.py`, in the same Redis command);
- `…:push:n:<node id>`     `{"k": "telemetry"}`: a heartbeat of the node (the node page);
- `…:push:cluster`         `{"k": "telemetry"}`: any heartbeat (the cluster overview);
- `…:push:a:<node id>`     `{"k": "assignments"}`: what the node must run or stop changed
  (`scheduler.dispatch.assignments_changed`); its agent, watching `/events/agent`, syncs at once
  instead of finding out at its next poll.

Without Redis (the embedded default) nothing is published and the stream answers 204, so
pages keep polling.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson
import redis
from django.conf import settings
from django.db import transaction

from foundation.redis_after_commit import after_commit, redis_cache

_clients: dict[str, redis.Redis] = {}


def enabled() -> bool:
    """Whether pushed updates exist here: they ride on Redis."""
    return bool(settings.REDIS_URL) and bool(getattr(settings, "PUSH_ENABLED", True))


def channel_prefix() -> str:
    prefix = settings.CACHES["default"].get("KEY_PREFIX", "") or "portal"
    return f"{prefix}:push:"


def project_channel(project_id: int) -> str:
    return f"{channel_prefix()}p:{project_id}"


def job_channel(job_id: int) -> str:
    return f"{channel_prefix()}j:{job_id}"


def node_channel(node_id: int) -> str:
    return f"{channel_prefix()}n:{node_id}"


def agent_channel(node_id: int) -> str:
    return f"{channel_prefix()}a:{node_id}"


def cluster_channel() -> str:
    return f"{channel_prefix()}cluster"


def _client() -> redis.Redis:
    url = str(settings.REDIS_URL)
    client = _clients.get(url)
    if client is None:
        client = _clients[url] = redis.Redis.from_url(url)
    return client


def _send(messages: list[tuple[str, bytes]]) -> None:
    """One round trip for all of them. Push is advisory: a Redis error loses the message
    (pages refresh on reconnect and fall back to polling), it never fails the write."""
    try:
        pipe = _client().pipeline(transaction=False)
        for channel, data in messages:
            pipe.publish(channel, data)
        pipe.execute()
    except redis.RedisError:
        pass


def _lost(exc: redis.RedisError) -> None:
    """Push is advisory: a message Redis did not take is lost, the write stands."""


def publish(messages: Iterable[tuple[str, dict[str, Any]]]) -> None:
    """Publish `(channel, message)` pairs once the current transaction commits (at once
    outside one), so a page that fetches on hearing it sees the committed state. On the
    cache's Redis (the same server; pub/sub ignores database numbers), in the round trip of
    after-commit commands queued just before or after them (`foundation.redis_after_commit`;
    never ahead of an `on_commit` hook registered before them)."""
    if not enabled():
        return
    encoded = [(channel, orjson.dumps(message)) for channel, message in messages]
    if not encoded:
        return
    cache = redis_cache()
    if cache is not None:
        commands = [("PUBLISH", channel, data) for channel, data in encoded]
        after_commit(cache, commands, on_error=_lost)
    else:
        transaction.on_commit(lambda: _send(encoded))


def jobs_changed(pairs: Iterable[tuple[int, int]]) -> None:
    """Jobs `(job id, project id)` changed what their pages and the queue show."""
    if not enabled():
        return
    by_project: dict[int, list[int]] = {}
    for job_id, project_id in pairs:
        by_project.setdefault(project_id, []).append(job_id)
    publish(
        (project_channel(project_id), {"k": "jobs", "ids": sorted(ids)})
        for project_id, ids in sorted(by_project.items())
    )


def log_appended(job_id: int, last: int) -> None:
    publish([(job_channel(job_id), {"k": "logs", "job": job_id, "last": last})])


def assignments_changed(node_ids: Iterable[int]) -> None:
    """The nodes' assignments changed: their agents' watches hear it after the commit."""
    publish((agent_channel(pk), {"k": "assignments"}) for pk in sorted(set(node_ids)))
