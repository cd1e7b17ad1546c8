"""The agent's watch (agent/watch.py) against a small server-sent event server: what it reads,
when it tells the agent to sync, and how it falls back to polling."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.config import Config
from agent.main import Agent
from agent.watch import Watch
from tests.polling import wait_for

TOKEN = "gpuagent_watch-test-token"


class EventServer:
    """Answers GET /events/agent: a stream (`ready`, then one `assignments` each time `notify`
    is set, then the end when `finish` is set), or `status` alone."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.requests: list[dict[str, str]] = []
        self.notify = threading.Event()
        self.finish = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                outer.requests.append({"path": self.path, **dict(self.headers)})
                if outer.status != 200 or self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self.send_response(outer.status if outer.status != 200 else 401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                self.wfile.write(b"retry: 3000\n\nevent: ready\ndata: {}\n\n")
                self.wfile.flush()
                while not outer.finish.wait(0.02):
                    if outer.notify.is_set():
                        outer.notify.clear()
                        self.wfile.write(b": keepalive\n\nevent: assignments\ndata: {}\n\n")
                        self.wfile.flush()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.finish.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def server() -> Iterator[EventServer]:
    s = EventServer()
    yield s
    s.close()


def watching(url: str) -> tuple[Watch, list[int], threading.Event, threading.Thread]:
    changes: list[int] = []
    watch = Watch(url, TOKEN, on_change=lambda: changes.append(1))
    stop = threading.Event()
    thread = threading.Thread(target=watch.run, args=(stop,), daemon=True)
    thread.start()
    return watch, changes, stop, thread


def test_ready_and_each_wakeup_make_the_agent_sync(server: EventServer) -> None:
    watch, changes, stop, thread = watching(server.url)
    try:
        wait_for(watch.live.is_set, timeout=5)
        assert len(changes) == 1  # on (re)connecting: whatever changed meanwhile
        assert server.requests[0]["path"] == "/events/agent"
        assert server.requests[0]["Accept"] == "text/event-stream"
        for n in (1, 2):
            server.notify.set()
            wait_for(lambda n=n: watch.wakeups == n, timeout=5)
        assert len(changes) == 3
        server.finish.set()  # the stream ends: not live, one sync at once, then it reconnects
        wait_for(lambda: not watch.live.is_set(), timeout=5)
        wait_for(lambda: len(changes) >= 4, timeout=5)
    finally:
        stop.set()
        watch.close()
        thread.join(5)
    assert not thread.is_alive()


@pytest.mark.parametrize("status", [204, 404, 401])
def test_a_portal_without_a_watch_leaves_the_agent_polling(status: int) -> None:
    server = EventServer(status=status)
    watch, changes, stop, thread = watching(server.url)
    try:
        wait_for(lambda: len(server.requests) == 1, timeout=5)
        stop.wait(0.5)
        assert len(server.requests) == 1  # it asks again minutes later, not in a loop
        assert not watch.live.is_set() and changes == []
    finally:
        stop.set()
        thread.join(5)
        server.close()
    assert not thread.is_alive()


def test_while_the_watch_is_live_polls_are_a_slow_fallback(tmp_path: Path) -> None:
    config = Config(
        portal_url="http://127.0.0.1:9",
        token=TOKEN,
        workdir=tmp_path,
        simulate=True,
        poll_interval_s=2.0,
        watch_poll_interval_s=30.0,
        runtime="process",
        job_uid_base=0,
    )
    agent = Agent(config)
    assert agent.watch is not None
    assert agent._poll_interval() == 2.0
    agent.watch.live.set()
    assert agent._poll_interval() == 30.0
    agent._next_poll = agent._next_contact = 0.0
    agent._next_poll = 10**9  # the next poll far away...
    assert agent.pause() == config.tick_s
    agent._assignments_changed()  # ...until a wake-up: the next round polls at once
    assert agent.pause() <= 0.005 and agent._wake.is_set()
    assert Agent(Config(**{**config.__dict__, "watch": False})).watch is None
