"""The portal's public API over HTTP: every answer is JSON, every error becomes an ApiError."""

from __future__ import annotations

import time
import uuid
from typing import Any
from urllib.parse import urlsplit

import requests

from gpucloud_cli import __version__

RETRY_DELAYS = (0.5, 1.5)  # seconds before the 2nd and 3rd attempts
RETRY_STATUSES = {502, 503, 504}  # a proxy or load balancer in front of a portal in trouble


class ApiError(Exception):
    """What to tell the user, and the exit status that says what kind of failure it was."""

    def __init__(self, message: str, *, status: int | None = None, exit_code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.exit_code = exit_code


def normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ApiError(
            f"Not a portal URL: {url!r}. Give it as https://portal.example.org.", exit_code=2
        )
    return url


class Api:
    def __init__(self, url: str, token: str, *, timeout: float = 30.0) -> None:
        self.url = normalize_url(url)
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers.update(
            {
                "Authorization": f"Bearer {token}",
                "Accept": "application/json",
                "User-Agent": f"gpucloud-cli/{__version__}",
            }
        )

    def get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        return self._call("GET", path, params=params)

    def post(
        self,
        path: str,
        body: Any = None,
        *,
        params: dict[str, Any] | None = None,
        raw: bytes | None = None,
        content_type: str = "application/yaml",
        idempotency_key: str | None = None,
    ) -> Any:
        # Every POST carries a key: a retry of this very command (same key) cannot act twice.
        headers = {"Idempotency-Key": idempotency_key or str(uuid.uuid4())}
        if raw is not None:
            headers["Content-Type"] = content_type
            return self._call("POST", path, params=params, data=raw, headers=headers)
        return self._call("POST", path, params=params, json=body, headers=headers)

    def delete(self, path: str) -> Any:
        return self._call("DELETE", path)

    def patch_bytes(self, path: str, data: bytes, *, headers: dict[str, str]) -> Any:
        """Send raw bytes (a chunk of an upload); `headers` say where it goes."""
        return self._call(
            "PATCH",
            path,
            data=data,
            headers={"Content-Type": "application/octet-stream", **headers},
        )

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        """One request, retried on a lost connection or a gateway error. A retried POST carries
        the same Idempotency-Key, so the portal runs it at most once."""
        for delay in (*RETRY_DELAYS, None):
            try:
                resp = self.session.request(
                    method, f"{self.url}{path}", timeout=self.timeout, **kwargs
                )
            except requests.exceptions.InvalidURL as exc:
                raise ApiError(f"Not a portal URL: {self.url} ({exc}).", exit_code=2) from exc
            except (requests.exceptions.Timeout, requests.exceptions.ConnectionError) as exc:
                if delay is not None:
                    time.sleep(delay)
                    continue
                raise _unreachable(self.url, self.timeout, exc) from exc
            if resp.status_code in RETRY_STATUSES and delay is not None:
                time.sleep(delay)
                continue
            break
        if resp.status_code == 204:
            return None
        try:
            data = resp.json()
        except ValueError:
            data = None
        if resp.ok and data is not None:
            return data
        raise ApiError(_error_message(resp, data), status=resp.status_code)


def _unreachable(url: str, timeout: float, exc: Exception) -> ApiError:
    if isinstance(exc, requests.exceptions.Timeout):
        return ApiError(f"The portal at {url} did not answer within {timeout:g} s.", exit_code=3)
    return ApiError(
        f"Cannot reach the portal at {url}: {_reason(exc)}. "
        "Check the URL (`gpucloud login --url ...`) and your network.",
        exit_code=3,
    )


def _reason(exc: Exception) -> str:
    text = str(exc)
    for marker in ("Connection refused", "Name or service not known", "No route to host"):
        if marker in text:
            return marker.lower()
    return text.split("(Caused by", 1)[-1].strip(" )") or text


def _error_message(resp: requests.Response, data: Any) -> str:
    """The API's own words: `message`, then each field at fault on its own line."""
    if isinstance(data, dict):
        message = str(data.get("message") or data.get("detail") or "")
        fields = data.get("fields") if isinstance(data.get("fields"), dict) else {}
        lines = [f"{message} (HTTP {resp.status_code})" if message else f"HTTP {resp.status_code}"]
        for name, messages in (fields or {}).items():
            lines.append(f"  {name}: {_flatten(messages)}")
        if len(lines) > 1 and len(fields or {}) == 1 and message.startswith(lines[1].strip()):
            lines = lines[:1]  # the message already is that one field's message
        return "\n".join(lines)
    if resp.status_code == 404:
        return f"HTTP 404 from {resp.url}: is {resp.url.split('/api/')[0]} the portal's address?"
    return f"HTTP {resp.status_code} from {resp.url}: the answer is not the portal's API."


def _flatten(messages: Any) -> str:
    if isinstance(messages, list):
        return " ".join(_flatten(m) for m in messages)
    if isinstance(messages, dict):
        return "; ".join(f"{k}: {_flatten(v)}" for k, v in messages.items())
    return str(messages)
