"""The agent's watch: the portal tells the node when its assignments change.

`GET {events_url}/events/agent` with the node token is a server-sent event stream from the
portal's events service (web/events.py `agent_watch`): `ready` once subscribed, then
`assignments` each time what the node must run or stop changes. On either, the agent syncs at
once (`on_change`), so a placed job starts without waiting for the next poll, and while the
watch is live the agent polls only as a slow fallback (`Config.watch_poll_interval_s`): a fleet
of idle nodes then costs the portal a few syncs per node per minute instead of one every poll
interval.

Nothing depends on the watch. A lost wake-up is healed by the fallback poll; where the portal
has no push (no Redis, or the events service is not deployed: 204 or 404), or the stream
drops, the agent polls at its usual interval and tries the watch again later.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import socket
import threading
import time
from collections.abc import Callable

from agent import __version__
from agent.client import Backoff, PortalConnection

log = logging.getLogger(__name__)

WATCH_PATH = "/events/agent"
# The events service sends a keepalive comment every 15 s: three missed and the stream is dead.
READ_TIMEOUT_S = 45.0
NO_WATCH_RETRY_S = 300.0  # the portal answered that it has no watch: poll, ask again later
UNAUTHORIZED_RETRY_S = 60.0


class Watch:
    """Run `run(stop)` in a thread of its own; `live` says whether wake-ups arrive now."""

    def __init__(
        self,
        events_url: str,
        token: str,
        *,
        on_change: Callable[[], None],
        ca_bundle: str | None = None,
        read_timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        self._connection = PortalConnection(
            events_url, timeout_s=read_timeout_s, ca_bundle=ca_bundle
        )
        self._headers = {
            "Authorization": f"Bearer {token}",
            "Accept": "text/event-stream",
            "User-Agent": f"gpu-cloud-agent/{__version__}",
        }
        self.on_change = on_change
        self.live = threading.Event()
        self.wakeups = 0  # assignments events heard (for tests and logs)
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None

    def __repr__(self) -> str:  # never shows the token
        return f"Watch({self._connection.host}:{self._connection.port})"

    def run(self, stop: threading.Event) -> None:
        backoff = Backoff(1.0, 30.0)
        while not stop.is_set():
            opened = time.monotonic()
            try:
                status, retry_after = self._stream(stop)
            except (OSError, http.client.HTTPException) as exc:
                status, retry_after = None, ""
                if not stop.is_set():
                    log.info("the watch dropped (%s): polling meanwhile", exc)
            finally:
                was_live = self.live.is_set()
                self.live.clear()
                self._close()
            if stop.is_set():
                return
            if was_live:
                self.on_change()  # back to the usual poll: one at once, nothing missed
            if status == 200 and time.monotonic() - opened > 5.0:
                backoff.reset()
                wait = 0.0  # the stream ended as streams do (PUSH_STREAM_MAX_S): reconnect
            elif status in (204, 404, 405):
                log.info("the portal has no watch here (%s): polling", status)
                wait = NO_WATCH_RETRY_S
            elif status in (401, 403):
                log.error("the watch: the portal rejected this node's token (%s)", status)
                wait = UNAUTHORIZED_RETRY_S
            elif status == 429 and retry_after.isdigit():
                wait = float(retry_after)
            else:
                wait = backoff.next()
            stop.wait(wait)

    def close(self) -> None:
        """Cut the stream (at shutdown: unblocks the thread's read)."""
        with self._lock:
            conn = self._conn
        if conn is not None and conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)

    def _close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _stream(self, stop: threading.Event) -> tuple[int, str]:
        """Read one stream until it ends: (its HTTP status, its Retry-After)."""
        conn = self._connection.open()
        with self._lock:
            self._conn = conn
        if stop.is_set():
            return 0, ""
        conn.request("GET", self._connection.target(WATCH_PATH), headers=self._headers)
        response = conn.getresponse()
        if response.status != 200:
            response.read()
            return response.status, response.getheader("Retry-After") or ""
        event = ""
        while not stop.is_set():
            line = response.readline()
            if not line:
                break  # the portal ended the stream
            text = line.decode("utf-8", "replace").rstrip("\r\n")
            if text.startswith("event:"):
                event = text[6:].strip()
            elif text == "":
                if event == "ready":
                    self.live.set()
                    self.on_change()  # what changed while it was not watching
                elif event == "assignments":
                    self.wakeups += 1
                    self.on_change()
                event = ""
        return 200, ""
