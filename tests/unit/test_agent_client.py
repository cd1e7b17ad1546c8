"""The agent's HTTP client against a tiny local server: retries, backoff, no blind 4xx retries."""

from __future__ import annotations

import json
import logging
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from agent.client import (
    API_PREFIX,
    Backoff,
    Conflict,
    PortalClient,
    PortalUnavailable,
    RequestRejected,
    Unauthorized,
)
from tests.polling import wait_for

TOKEN = "node-token-s3cr3t"


class Scripted:
    """A loopback HTTP server answering from a script of (status, body) replies."""

    def __init__(
        self, replies: list[tuple[int, Any]], port: int = 0, *, keep_alive: bool = False
    ) -> None:
        """`keep_alive`: HTTP/1.1, the connection kept open after each answer."""
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []
        self.connections = 0
        self.closed = 0  # connections the server has closed its end of
        self.drop_after_answer = False  # close a kept-alive connection, as an idle timeout does
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

            def setup(self) -> None:
                outer.connections += 1
                super().setup()

            def _reply(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                outer.requests.append(
                    {
                        "method": self.command,
                        "path": self.path,
                        "auth": self.headers.get("Authorization"),
                        "body": json.loads(raw) if raw else None,
                    }
                )
                status, body = outer.replies.pop(0) if outer.replies else (200, {"ok": True})
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                self.wfile.flush()
                if outer.drop_after_answer:
                    self.close_connection = True  # without saying so: the client finds out

            do_GET = do_POST = _reply

            def log_message(self, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            def shutdown_request(self, request: Any) -> None:
                super().shutdown_request(request)
                outer.closed += 1

        self.server = Server(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[..., Scripted]]:
    servers: list[Scripted] = []

    def start(replies: list[tuple[int, Any]], port: int = 0, **kw: Any) -> Scripted:
        s = Scripted(replies, port, **kw)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.close()


def client_for(url: str, **kw: Any) -> PortalClient:
    kw.setdefault("backoff_initial_s", 0.01)
    kw.setdefault("backoff_max_s", 0.05)
    kw.setdefault("timeout_s", 2.0)
    return PortalClient(url, TOKEN, rng=random.Random(0), **kw)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_sends_bearer_token_and_json(serve: Callable[..., Scripted]) -> None:
    server = serve([(200, {"node": "n1", "heartbeat_interval_s": 5, "poll_interval_s": 1})])
    client = client_for(server.url + "/")
    answer = client.register({"hostname": "h"})
    assert answer["node"] == "n1"
    (req,) = server.requests
    assert req == {
        "method": "POST",
        "path": f"{API_PREFIX}/register",
        "auth": f"Bearer {TOKEN}",
        "body": {"hostname": "h"},
    }
    assert TOKEN not in repr(client)


def test_retries_5xx_with_backoff_then_succeeds(serve: Callable[..., Scripted]) -> None:
    server = serve([(503, {}), (502, {}), (500, {}), (200, {"ok": True, "fenced": False})])
    answer = client_for(server.url).heartbeat({"telemetry": [], "running": []}, attempts=5)
    assert answer == {"ok": True, "fenced": False}
    assert len(server.requests) == 4
    assert all(r["path"].endswith("/heartbeat") for r in server.requests)


def test_gives_up_after_the_attempts(serve: Callable[..., Scripted]) -> None:
    server = serve([(503, {})] * 5)
    with pytest.raises(PortalUnavailable, match=r"HTTP 503.*3 attempts"):
        client_for(server.url).assignments(attempts=3)
    assert len(server.requests) == 3


@pytest.mark.parametrize(
    ("status", "error"),
    [(400, RequestRejected), (404, RequestRejected), (401, Unauthorized), (403, Unauthorized)],
)
def test_does_not_retry_4xx(
    serve: Callable[..., Scripted], status: int, error: type[Exception]
) -> None:
    server = serve([(status, {"detail": "nope"})] + [(200, {})] * 3)
    with pytest.raises(error, match=f"HTTP {status}: nope") as caught:
        client_for(server.url).heartbeat({}, attempts=5)
    assert caught.value.status == status  # type: ignore[attr-defined]
    assert len(server.requests) == 1


def test_409_is_a_conflict_with_its_detail(serve: Callable[..., Scripted]) -> None:
    server = serve([(409, {"detail": "stale attempt"})])
    with pytest.raises(Conflict) as caught:
        client_for(server.url).job_logs(7, {"attempt": 1, "seq": 0, "stream": "stdout", "text": ""})
    assert caught.value.detail == "stale attempt"
    assert server.requests[0]["path"] == f"{API_PREFIX}/jobs/7/logs"


def test_connection_refused_is_retried_then_given_up() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(PortalUnavailable, match=r"ConnectionRefusedError.*3 attempts"):
        client_for(url).assignments(attempts=3)


def test_requests_share_one_kept_alive_connection(serve: Callable[..., Scripted]) -> None:
    server = serve([], keep_alive=True)
    client = client_for(server.url)
    for _ in range(5):
        assert client.sync({"version": "ab", "reports": []}) == {"ok": True}
    assert len(server.requests) == 5
    assert server.connections == 1


def test_a_connection_the_portal_closed_while_idle_is_reopened_without_a_retry(
    serve: Callable[..., Scripted], caplog: pytest.LogCaptureFixture
) -> None:
    """An idle timeout on the portal's side (gunicorn's keepalive) is not a failure: the next
    request goes out on a new connection at once, not after a backoff and a warning."""
    server = serve([], keep_alive=True)
    server.drop_after_answer = True
    client = client_for(server.url, backoff_initial_s=5, backoff_max_s=5)
    for i in range(3):
        wait_for(lambda i=i: server.closed == i)  # the server has closed its end by now
        assert client.heartbeat({"telemetry": [], "running": []}) == {"ok": True}
    assert server.connections == 3
    assert len(server.requests) == 3  # each went out once: no failed attempt, so no backoff
    assert "retry" not in caplog.text


def test_rides_out_a_portal_restart(serve: Callable[..., Scripted]) -> None:
    """The portal is down when the agent calls; the call goes through once it is back."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    holder: dict[str, Scripted] = {}

    def come_back() -> None:
        time.sleep(0.4)
        holder["server"] = serve([(200, {"node": "n1"})], port=port)

    threading.Thread(target=come_back, daemon=True).start()
    answer = client_for(url, backoff_max_s=0.1).register({"hostname": "h"})  # no attempt limit
    assert answer == {"node": "n1"}
    assert len(holder["server"].requests) == 1


def test_stop_event_ends_retrying_promptly(caplog: pytest.LogCaptureFixture) -> None:
    """The stop event ends an hour's backoff: the call returns once it is set."""
    caplog.set_level(logging.DEBUG)
    stop = threading.Event()
    client = client_for(
        f"http://127.0.0.1:{free_port()}", backoff_initial_s=3600, backoff_max_s=3600
    )
    raised: list[BaseException] = []

    def call() -> None:
        try:
            client.register({}, stop=stop)
        except PortalUnavailable as e:
            raised.append(e)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    wait_for(lambda: "retry 1 in" in caplog.text)  # the first attempt failed: backing off
    stop.set()
    caller.join(30)  # a deadline for the test, not a speed claim: the backoff is an hour
    assert not caller.is_alive(), "the stop event did not end the backoff"
    assert len(raised) == 1 and "stopped" in str(raised[0])


def test_backoff_is_exponential_jittered_and_capped() -> None:
    backoff = Backoff(0.5, 30.0, rng=random.Random(1))
    delays = [backoff.next() for _ in range(12)]
    ceilings = [min(30.0, 0.5 * 2**i) for i in range(12)]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    assert delays[-1] >= 15.0 and max(delays) <= 30.0
    assert len(set(delays)) == len(delays)  # jittered
    backoff.reset()
    assert backoff.next() <= 0.5
    same = Backoff(0.5, 30.0, rng=random.Random(1))
    assert [same.next() for _ in range(12)] == delays  # seeded: reproducible
