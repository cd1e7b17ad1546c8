"""The portal's agent API over HTTP(S): bearer token, JSON bodies, retries with capped backoff.

Connection errors, timeouts, 429 and 5xx are retried with exponential backoff and jitter, so the
agent rides out a portal restart. Other 4xx are not retried: 401/403 raise `Unauthorized`, 409
raises `Conflict` (a stale attempt, or a fenced node), the rest `RequestRejected`. The token is
sent only in the Authorization header and never logged.

Requests go over one kept-alive `http.client` connection rather than a `requests.Session`: an
idle sync cost the agent about 1.2 ms of CPU through requests (its per-request environment,
proxy and adapter machinery) and under 0.5 ms this way. What requests gave is kept: the proxy
from the environment (`HTTPS_PROXY`, `HTTP_PROXY`, `NO_PROXY`, read once), certificates checked
against requests' CA bundle (certifi) unless `ca_bundle` names another.
"""

from __future__ import annotations

import http.client
import json
import logging
import random
import select
import ssl
import threading
import time
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import requests.certs

from agent import __version__

log = logging.getLogger(__name__)

API_PREFIX = "/api/agent/v1"


class PortalError(Exception):
    """The portal did not accept a request."""

    def __init__(self, message: str, *, status: int | None = None, detail: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail


class PortalUnavailable(PortalError):
    """Transient failures (connection, timeout, 5xx) outlasted the attempts, or we were stopped."""


class Unauthorized(PortalError):
    """401/403: the node token is wrong, revoked, or the node is retired."""


class Conflict(PortalError):
    """409: the job attempt is stale (forget it), or the node is fenced."""


class RequestRejected(PortalError):
    """Any other 4xx: the request itself is wrong; resending it will not help."""


class Backoff:
    """Exponential backoff with jitter: each delay is in [d/2, d], d = initial·2ⁿ capped at maximum."""

    def __init__(
        self,
        initial: float = 0.5,
        maximum: float = 30.0,
        *,
        factor: float = 2.0,
        rng: random.Random | None = None,
    ) -> None:
        self.initial = initial
        self.maximum = maximum
        self.factor = factor
        self.failures = 0
        self._rng = rng or random.Random()

    def next(self) -> float:
        ceiling = min(self.maximum, self.initial * self.factor**self.failures)
        self.failures += 1
        return ceiling / 2 + self._rng.uniform(0.0, ceiling / 2)

    def reset(self) -> None:
        self.failures = 0


@dataclass
class _Transient:
    why: str
    retry_after: float | None = None


def _detail(payload: bytes) -> str:
    try:
        body = json.loads(payload)
    except ValueError:
        return payload.decode("utf-8", "replace")[:300]
    if isinstance(body, dict):
        return str(body.get("detail") or body.get("error") or body)[:300]
    return str(body)[:300]


class PortalConnection:
    """One kept-alive HTTP(S) connection to the portal (through the environment's proxy, if
    one applies), opened on first use and again after the portal closes it."""

    def __init__(self, portal_url: str, *, timeout_s: float, ca_bundle: str | None) -> None:
        parts = urlsplit(portal_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the portal URL must be http(s)://host[:port]: {portal_url!r}")
        self.https = parts.scheme == "https"
        self.host, self.port = parts.hostname, parts.port or (443 if self.https else 80)
        self.timeout_s = timeout_s
        self.prefix = parts.path.rstrip("/")  # a portal served under a path
        self.tls = (
            ssl.create_default_context(cafile=ca_bundle or requests.certs.where())
            if self.https
            else None
        )
        proxy = urllib.request.getproxies().get(parts.scheme)
        self.proxy = (
            urlsplit(proxy) if proxy and not urllib.request.proxy_bypass(self.host) else None
        )
        self._conn: http.client.HTTPConnection | None = None

    def open(self) -> http.client.HTTPConnection:
        """A new connection to the portal (or to the proxy, tunnelled for HTTPS), unopened."""
        if self.proxy is None:
            host, port = self.host, self.port
        else:
            host, port = self.proxy.hostname or "", self.proxy.port or 80
        if self.https:
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                host, port, timeout=self.timeout_s, context=self.tls
            )
            if self.proxy is not None:
                conn.set_tunnel(self.host, self.port)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=self.timeout_s)
        return conn

    def target(self, path: str) -> str:
        """The request target for `path`: under the portal's path prefix, or the full URL
        through a plain-HTTP proxy."""
        if self.proxy is not None and not self.https:  # a plain-HTTP proxy takes the full URL
            return f"http://{self.host}:{self.port}{self.prefix}{path}"
        return self.prefix + path

    def _closed_by_peer(self, conn: http.client.HTTPConnection) -> bool:
        """Whether the portal closed this idle connection (it sends nothing unasked)."""
        if conn.sock is None:
            return True
        poller = select.poll()
        poller.register(conn.sock, select.POLLIN)
        return bool(poller.poll(0))

    def exchange(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[int, str, bytes]:
        """(status, Retry-After, body) of one request; OSError or HTTPException on failure."""
        conn = self._conn
        if conn is not None and self._closed_by_peer(conn):
            self.close()
            conn = None
        reused = conn is not None
        if conn is None:
            conn = self._conn = self.open()
        try:
            conn.request(method, self.target(path), body=body, headers=headers)
            response = conn.getresponse()
            payload = response.read()
        except http.client.RemoteDisconnected:
            self.close()
            if not reused:
                raise
            # It closed the kept-alive connection as the request went out: nothing was answered,
            # so the request goes once more, on a new connection.
            return self.exchange(method, path, body, headers)
        except (OSError, http.client.HTTPException):
            self.close()
            raise
        if response.will_close:
            self.close()
        return response.status, response.getheader("Retry-After") or "", payload

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class PortalClient:
    """One node's client for `{portal_url}/api/agent/v1`."""

    def __init__(
        self,
        portal_url: str,
        token: str,
        *,
        timeout_s: float = 10.0,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        ca_bundle: str | None = None,
        stop: threading.Event | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.base_url = portal_url.rstrip("/") + API_PREFIX
        self.timeout_s = timeout_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.stop = stop
        self._rng = rng or random.Random()
        self._connection = PortalConnection(portal_url, timeout_s=timeout_s, ca_bundle=ca_bundle)
        self._lock = threading.Lock()  # one request at a time on the one connection
        self._headers = {
            "Authorization": f"Bearer {token}",
            "Accept": "application/json",
            "User-Agent": f"gpu-cloud-agent/{__version__}",
        }

    def __repr__(self) -> str:  # never shows the token
        return f"PortalClient({self.base_url!r})"

    def close(self) -> None:
        with self._lock:
            self._connection.close()

    def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        attempts: int | None = None,
        stop: threading.Event | None = None,
    ) -> dict[str, Any]:
        """Send one request; retry transient failures up to `attempts` (None: until `stop`)."""
        stop = stop if stop is not None else self.stop
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        backoff = Backoff(self.backoff_initial_s, self.backoff_max_s, rng=self._rng)
        attempt = 0
        while True:
            attempt += 1
            result = self._attempt(method, path, data)
            if not isinstance(result, _Transient):
                return result
            if attempts is not None and attempt >= attempts:
                raise PortalUnavailable(
                    f"{method} {path}: {result.why} (gave up after {attempt} attempts)"
                )
            delay = backoff.next()
            if result.retry_after is not None:
                delay = max(delay, min(result.retry_after, self.backoff_max_s))
            level = logging.WARNING if attempt == 1 or attempt % 10 == 0 else logging.DEBUG
            log.log(level, "%s %s: %s; retry %d in %.1fs", method, path, result.why, attempt, delay)
            if stop is not None:
                if stop.wait(delay):
                    raise PortalUnavailable(f"{method} {path}: {result.why} (stopped)")
            else:
                time.sleep(delay)

    def _attempt(self, method: str, path: str, data: bytes | None) -> dict[str, Any] | _Transient:
        """The JSON answer, a `_Transient` failure worth retrying, or an exception for a 4xx."""
        headers = self._headers
        if data is not None:
            headers = {**headers, "Content-Type": "application/json"}
        try:
            with self._lock:
                status, retry_after, payload = self._connection.exchange(
                    method, API_PREFIX + path, data, headers
                )
        except (OSError, http.client.HTTPException) as exc:  # refused, reset, timeout, TLS
            return _Transient(f"{type(exc).__name__}: {exc}")
        if 200 <= status < 300:
            return self._json(status, payload)
        if status >= 500 or status == 429:
            seconds = float(retry_after) if retry_after.replace(".", "", 1).isdigit() else None
            return _Transient(f"HTTP {status}", seconds)
        detail = _detail(payload)
        message = f"{method} {path}: HTTP {status}: {detail}"
        if status in (401, 403):
            raise Unauthorized(message, status=status, detail=detail)
        if status == 409:
            raise Conflict(message, status=status, detail=detail)
        raise RequestRejected(message, status=status, detail=detail)

    @staticmethod
    def _json(status: int, payload: bytes) -> dict[str, Any]:
        if not payload:
            return {}
        try:
            data = json.loads(payload)
        except ValueError as exc:
            raise PortalError(f"the portal answered {status} without JSON") from exc
        if not isinstance(data, dict):
            raise PortalError("the portal answered with JSON that is not an object")
        return data

    # -- the contract --------------------------------------------------------------------------

    def register(self, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
        return self.request("POST", "/register", body, **kw)

    def heartbeat(self, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
        return self.request("POST", "/heartbeat", body, **kw)

    def assignments(self, **kw: Any) -> dict[str, Any]:
        return self.request("GET", "/assignments", **kw)

    def sync(self, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
        """Started/exited reports and the assignments in one round trip."""
        return self.request("POST", "/sync", body, **kw)

    def job_started(self, job_id: int, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
        return self.request("POST", f"/jobs/{job_id}/started", body, **kw)

    def job_exited(self, job_id: int, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
        return self.request("POST", f"/jobs/{job_id}/exited", body, **kw)

    def job_logs(self, job_id: int, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
        return self.request("POST", f"/jobs/{job_id}/logs", body, **kw)
