"""The pushed-updates stream: server-sent events fed by Redis pub/sub (`foundation.push`).

`GET /events/?job=<id>` (a job page), `?array=<id>` (an array's page: any of its shards'
states, and each shard's log appends), `?node=<id>` (an operator's node page), `?cluster=1`
(the cluster overview), `?queue=1` (job lists); several may be combined. Each event names
what changed (`job`, `logs`, `telemetry`, `queue`; `ready` when the stream is open) and the
page fetches that part through its usual view (`static/js/push.js`). Permissions are those of
the pages: a job the user cannot see is 404, operators' topics need staff.

Served by an async view under the ASGI events service (`config/asgi_events.py`, uvicorn
workers): an open page holds a coroutine and a few kilobytes, not a worker thread. Each worker
process has one Redis subscription (`Hub`) fanned out to its streams. Under WSGI (runserver,
gunicorn's sync workers) or without Redis the answer is 204, which tells EventSource not to
reconnect: the page keeps polling. A stream ends after `PUSH_STREAM_MAX_S` (the browser
reconnects, and permissions are checked again).

`GET /events/agent` is a node agent's watch, authenticated by its node token: an
`assignments` event each time what the node must run or stop changes (`foundation.push`
`assignments_changed`), so the agent syncs at once and polls only as a slow fallback. The
same answers tell it to poll instead: 204 (no push here), and the stream's end.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
import redis
import redis.asyncio as aioredis
from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse

from foundation import push
from foundation.params import whole_number
from portal.errors import DomainError
from portal.models import User
from portal.selectors import project_list_visible_to
from scheduler.dependencies import array_members
from scheduler.models import Job, Node
from scheduler.selectors import job_get_visible

KEEPALIVE_S = 15.0  # a comment line, so proxies and the browser keep the stream open
# The least time between two events of one kind on one stream: a fleet's heartbeats, or a burst
# of submissions, reach a page as one refresh per interval (the first at once).
COALESCE_S = {"telemetry": 2.0, "queue": 1.0, "job": 0.25, "logs": 0.0, "assignments": 0.0}


@dataclass(frozen=True, slots=True)
class Route:
    """What a message on one channel means to this stream."""

    # project channel on a job or array page: only messages naming these jobs
    job_ids: frozenset[int] = frozenset()
    queue: bool = False  # project channel on a job list: any change is a queue change
    logs_only: bool = False  # a shard's channel on an array page: its log appends only


class Hub:
    """One Redis subscription per worker process (per event loop), shared by its streams:
    a thousand open pages cost one Redis connection, not a thousand."""

    def __init__(self, url: str) -> None:
        self.client = aioredis.Redis.from_url(url)
        self.pubsub: Any = None
        self.listeners: dict[str, set[asyncio.Queue[tuple[str, bytes] | None]]] = {}
        self.reader: asyncio.Task[None] | None = None
        self.lock = asyncio.Lock()

    async def join(self, channels: list[str], queue: asyncio.Queue[Any]) -> None:
        async with self.lock:
            if self.pubsub is None:
                self.pubsub = self.client.pubsub()
            new = [c for c in channels if c not in self.listeners]
            for channel in channels:
                self.listeners.setdefault(channel, set()).add(queue)
            if new:
                await self.pubsub.subscribe(*new)
            if self.reader is None or self.reader.done():
                self.reader = asyncio.create_task(self._read())

    async def leave(self, channels: list[str], queue: asyncio.Queue[Any]) -> None:
        async with self.lock:
            gone = []
            for channel in channels:
                queues = self.listeners.get(channel)
                if queues is None:
                    continue
                queues.discard(queue)
                if not queues:
                    del self.listeners[channel]
                    gone.append(channel)
            if gone and self.pubsub is not None:
                with contextlib.suppress(redis.RedisError, OSError):
                    await self.pubsub.unsubscribe(*gone)

    async def _read(self) -> None:
        try:
            while self.listeners:
                message = await self.pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
                if not message or message.get("type") != "message":
                    continue
                channel = message["channel"].decode()
                for queue in tuple(self.listeners.get(channel, ())):
                    queue.put_nowait((channel, message["data"]))
        except (redis.RedisError, OSError):
            # Redis went away: end every stream; browsers reconnect, and fall back to polling
            # if it is still down.
            for queues in self.listeners.values():
                for queue in queues:
                    queue.put_nowait(None)
            self.listeners.clear()
            pubsub, self.pubsub = self.pubsub, None
            with contextlib.suppress(Exception):
                await pubsub.aclose()


_hubs: dict[int, tuple[asyncio.AbstractEventLoop, Hub]] = {}


def hub() -> Hub:
    """This event loop's hub (a Redis connection belongs to the loop that opened it)."""
    loop = asyncio.get_running_loop()
    found = _hubs.get(id(loop))
    if found is None or found[0] is not loop:
        found = _hubs[id(loop)] = (loop, Hub(str(settings.REDIS_URL)))
    return found[1]


def routes_for(user: User, params: Any) -> dict[str, tuple[str, Route]]:
    """channel → (event name, route) for what the page asked, as far as the user may see it."""
    routes: dict[str, tuple[str, Route]] = {}
    job_id = whole_number(params.get("job"), maximum=2**63 - 1) if params.get("job") else None
    watched: dict[int, set[int]] = {}  # project → the jobs whose state this page shows
    if job_id is not None:
        job = job_get_visible(user=user, job_id=job_id)  # 404 for another tenant's job
        watched.setdefault(job.project_id, set()).add(job.pk)
        routes[push.job_channel(job.pk)] = ("", Route())  # logs and telemetry name themselves
    array_id = whole_number(params.get("array"), maximum=2**63 - 1) if params.get("array") else None
    if array_id is not None:
        root = job_get_visible(user=user, job_id=array_id)  # a shard's page shows its array
        root_id = root.array_parent_id or root.pk
        shards = list(Job.objects.filter(array_members(root_id)).values_list("pk", flat=True))
        watched.setdefault(root.project_id, set()).update(shards)
        for shard in shards:  # the page shows one shard's log at a time, any of them
            routes.setdefault(push.job_channel(shard), ("", Route(logs_only=True)))
    for project_id, ids in watched.items():
        routes[push.project_channel(project_id)] = ("job", Route(job_ids=frozenset(ids)))
    if params.get("queue"):
        for project_id in project_list_visible_to(user=user).values_list("pk", flat=True):
            routes.setdefault(push.project_channel(project_id), ("queue", Route(queue=True)))
    node_id = whole_number(params.get("node"), maximum=2**63 - 1) if params.get("node") else None
    if node_id is not None or params.get("cluster"):
        if not user.is_staff:
            raise PermissionError
        if node_id is not None:
            if not Node.objects.filter(pk=node_id).exists():
                raise Http404
            routes[push.node_channel(node_id)] = ("telemetry", Route())
        if params.get("cluster"):
            routes[push.cluster_channel()] = ("telemetry", Route())
    return routes


def sse(event: str, data: dict[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def translate(routes: dict[str, tuple[str, Route]], channel: str, raw: bytes) -> tuple[str, dict]:
    """The event a message on `channel` becomes on this stream ("" to drop it)."""
    found = routes.get(channel)
    if found is None:
        return "", {}
    event, route = found
    try:
        message = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return "", {}
    kind = message.get("k", "")
    if route.job_ids:  # a job (array) page hears only of its own jobs on the project channel
        hit = sorted(route.job_ids.intersection(message.get("ids", ())))
        return ("job", {"id": hit[0], "ids": hit}) if hit else ("", {})
    if route.queue:
        return "queue", {}
    if event:
        return event, {}
    if kind == "logs":
        return "logs", {"last": message.get("last", 0), "job": message.get("job")}
    if kind == "telemetry" and not route.logs_only:
        return "telemetry", {}
    return "", {}


async def stream(routes: dict[str, tuple[str, Route]], max_s: float) -> AsyncGenerator[bytes, None]:
    queue: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue()
    channels = list(routes)
    the_hub = hub()
    try:
        await the_hub.join(channels, queue)
    except BaseException:
        await the_hub.leave(channels, queue)
        raise
    try:
        # retry: the browser's reconnection delay; ready: the page refreshes what it may have
        # missed between rendering and now (and after every reconnection).
        yield b"retry: 3000\n\n" + sse("ready", {})
        loop = asyncio.get_running_loop()
        end = loop.time() + max_s
        last_sent: dict[str, float] = {}
        due: dict[str, dict[str, Any]] = {}  # events held back by COALESCE_S, latest data
        while (now := loop.time()) < end:
            wait = min(KEEPALIVE_S, end - now)
            if due:
                wait = min(wait, *(last_sent[e] + COALESCE_S[e] - now for e in due))
            try:
                item = await asyncio.wait_for(queue.get(), timeout=max(0.0, wait))
            except TimeoutError:
                item = ("", b"") if due else None
                if item is None:
                    yield b": keepalive\n\n"
                    continue
            if item is None:
                return  # Redis went away
            out = []
            if item[0]:
                event, data = translate(routes, *item)
                if event:
                    due[event] = data
            now = loop.time()
            for event in list(due):
                if now - last_sent.get(event, -1e9) >= COALESCE_S.get(event, 0.0):
                    out.append(sse(event, due.pop(event)))
                    last_sent[event] = now
            if out:
                yield b"".join(out)
    finally:
        await the_hub.leave(channels, queue)


async def events(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    user = await request.auser()
    if not user.is_authenticated:
        return HttpResponse(status=403)
    if not push.enabled() or not isinstance(request, ASGIRequest):
        return HttpResponse(status=204)  # no push here: EventSource gives up, the page polls
    try:
        routes = await sync_to_async(routes_for)(user, request.GET)
    except PermissionError:
        return HttpResponse(status=403)
    except DomainError as exc:  # NotFound: another tenant's job looks like no job
        return HttpResponse(exc.message, status=exc.status)
    except Http404:
        return HttpResponse(status=404)
    if not routes:
        return HttpResponse("Name a job, array, node, cluster or queue.", status=400)
    return await _streaming(routes)


async def agent_watch(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    """A node agent's stream of `assignments` events (see the module's docstring)."""
    from scheduler.agent_api import gate
    from scheduler.agent_api.views import AgentThrottle

    header = request.headers.get("Authorization", "").split()
    if len(header) != 2 or header[0] != "Bearer":
        return HttpResponse("Send 'Authorization: Bearer <node token>'.", status=401)
    throttle = AgentThrottle()  # a (re)connection counts as one of the node's syncs
    found = await sync_to_async(gate.agent_lookup)(header[1], throttle=throttle.window())
    if found is None:
        return HttpResponse("Unknown or retired node token.", status=401)
    hits, limit = found.throttle_hits, throttle.num_requests
    if hits is not None and limit is not None and hits > limit:
        response = HttpResponse("Too many watch connections: retry later.", status=429)
        response["Retry-After"] = str(found.retry_after)
        return response
    if not push.enabled() or not isinstance(request, ASGIRequest):
        return HttpResponse(status=204)  # no push here: the agent polls
    routes = {push.agent_channel(found.node_id): ("assignments", Route())}
    return await _streaming(routes)


async def _streaming(routes: dict[str, tuple[str, Route]]) -> HttpResponse | StreamingHttpResponse:
    """The stream's response once subscribed; 503 when Redis cannot be reached."""
    try:
        body = stream(routes, float(getattr(settings, "PUSH_STREAM_MAX_S", 300)))
        first = await anext(body)  # subscribed (or Redis is down: 503, the client polls)
    except (redis.RedisError, OSError):
        return HttpResponse(status=503)

    async def chained() -> AsyncIterator[bytes]:
        try:
            yield first
            async for chunk in body:
                yield chunk
        finally:
            # leave the hub when the client goes away (at a loop's shutdown it may be closing
            # already, on its own)
            with contextlib.suppress(RuntimeError):
                await body.aclose()

    response = StreamingHttpResponse(chained(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: do not buffer the stream
    return response
