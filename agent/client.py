"""The portal's agent API over HTTP(S): bearer token, JSON bodies, retries with capped backoff.

Connection errors, timeouts, 429 and 5xx are retried with exponential backoff and jitter, so the
agent rides out a portal restart. Other 4xx are not retried: 401/403 raise `Unauthorized`, 409
raises `Conflict` (a stale attempt, or a fenced node), the rest `RequestRejected`. The token is
sent only in the Authorization header and never logged.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Any

import requests

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


def _detail(response: requests.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    if isinstance(body, dict):
        return str(body.get("detail") or body.get("error") or body)[:300]
    return str(body)[:300]


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
        session: requests.Session | None = None,
    ) -> None:
        self.base_url = portal_url.rstrip("/") + API_PREFIX
        self.timeout_s = timeout_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.stop = stop
        self._rng = rng or random.Random()
        self._session = session or requests.Session()
        self._session.headers.update(
            {
                "Authorization": f"Bearer {token}",
                "Accept": "application/json",
                "User-Agent": f"gpu-cloud-agent/{__version__}",
            }
        )
        if ca_bundle:
            self._session.verify = ca_bundle

    def __repr__(self) -> str:  # never shows the token
        return f"PortalClient({self.base_url!r})"

    def close(self) -> None:
        self._session.close()

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
        url = self.base_url + path
        backoff = Backoff(self.backoff_initial_s, self.backoff_max_s, rng=self._rng)
        attempt = 0
        while True:
            attempt += 1
            result = self._attempt(method, url, body)
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

    def _attempt(
        self, method: str, url: str, body: dict[str, Any] | None
    ) -> dict[str, Any] | _Transient:
        """The JSON answer, a `_Transient` failure worth retrying, or an exception for a 4xx."""
        try:
            response = self._session.request(method, url, json=body, timeout=self.timeout_s)
        except (
            requests.ConnectionError,
            requests.Timeout,
            requests.exceptions.ChunkedEncodingError,
        ) as exc:
            return _Transient(f"{type(exc).__name__}: {exc}")
        status = response.status_code
        if 200 <= status < 300:
            return self._json(response)
        if status >= 500 or status == 429:
            retry_after = response.headers.get("Retry-After", "")
            seconds = float(retry_after) if retry_after.replace(".", "", 1).isdigit() else None
            return _Transient(f"HTTP {status}", seconds)
        detail = _detail(response)
        message = f"{method} {url[len(self.base_url) :]}: HTTP {status}: {detail}"
        if status in (401, 403):
            raise Unauthorized(message, status=status, detail=detail)
        if status == 409:
            raise Conflict(message, status=status, detail=detail)
        raise RequestRejected(message, status=status, detail=detail)

    @staticmethod
    def _json(response: requests.Response) -> dict[str, Any]:
        if not response.content:
            return {}
        try:
            data = response.json()
        except ValueError as exc:
            raise PortalError(f"the portal answered {response.status_code} without JSON") from exc
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
