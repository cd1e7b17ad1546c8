"""`Idempotency-Key` on the API's POSTs: a retried request gets the first answer, once.

A client that may retry (a lost connection, a timeout) sends `Idempotency-Key: <unique string>`.
The first request with a key runs and, when it succeeds (2xx), its answer (status, body,
`Location`) is stored with the key; a retry with the same key, by the same user, to the same
method and path with the same body, gets that answer back (with `Idempotent-Replayed: true`) and
runs nothing. The same key with another request is a 422. An answer that is not a success is not
kept: such a request changed nothing, so a retry simply runs again.

Keys live in PostgreSQL (`IdempotencyKey`), not Redis: the answer is written in the transaction of
the request itself, so a crash cannot leave a created job without its stored answer (a retry would
create a second job) or an answer without its job. The unique (user, key) row is also the lock: a
concurrent retry's insert waits on the first request's uncommitted row, then finds its answer.
Keys are kept 24 hours; each new key first deletes its user's expired ones, so the table holds at
most a day of keys per user with no periodic job.

An answer may carry a secret (a new API token), and tokens are stored only hashed: so the key is
stored as a hash too, and the answer is sealed with a keystream derived from the key itself
(HMAC-SHA256 in counter mode, one message per key). The table alone reveals no answer; whoever
holds the key (the client that chose it) can have it again, which is the point.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from datetime import timedelta
from typing import Any, NamedTuple

from django.db import IntegrityError, transaction
from django.http.request import RawPostDataException
from django.utils import timezone
from rest_framework.request import Request
from rest_framework.response import Response

from foundation.fastjson import JSONRenderer
from portal.errors import Conflict, DomainError
from portal.models import IdempotencyKey, User

HEADER = "Idempotency-Key"
META_KEY = "HTTP_IDEMPOTENCY_KEY"
REPLAYED_HEADER = "Idempotent-Replayed"
KEY_PATTERN = r"^[\x21-\x7e]{1,255}$"
KEY_RE = re.compile(KEY_PATTERN)
TTL = timedelta(hours=24)


class IdempotencyKeyReused(DomainError):
    status = 422

    def __init__(self, message: str) -> None:
        super().__init__(message, code="idempotency_key_reused")


class Replay(Exception):
    """Raised after authentication when the key already has an answer: that answer is sent."""

    def __init__(self, response: Response) -> None:
        super().__init__("replay")
        self.response = response


def _fingerprint(request: Request) -> str:
    try:
        body = request._request.body
    except RawPostDataException:  # a multipart body was streamed: hash what it parsed to
        body = json.dumps(request.data, sort_keys=True, default=str).encode()
    digest = hashlib.sha256()
    for part in ((request.method or "").encode(), request.get_full_path().encode(), body):
        digest.update(len(part).to_bytes(8, "big") + part)
    return digest.hexdigest()


def _key_hash(user_id: int, key: str) -> str:
    return hashlib.sha256(f"{user_id}:{key}".encode()).hexdigest()


def _keystream(key: str, length: int) -> bytes:
    stream = bytearray()
    counter = 0
    while len(stream) < length:
        block = b"idempotent-answer:" + counter.to_bytes(8, "big")
        stream += hmac.new(key.encode(), block, hashlib.sha256).digest()
        counter += 1
    return bytes(stream[:length])


def _xor_stream(key: str, data: bytes) -> bytes:
    stream = _keystream(key, len(data))
    return (int.from_bytes(data, "big") ^ int.from_bytes(stream, "big")).to_bytes(len(data), "big")


def seal(key: str, plain: bytes) -> str:
    return base64.b64encode(_xor_stream(key, plain)).decode()


def unseal(key: str, sealed: str) -> bytes:
    return _xor_stream(key, base64.b64decode(sealed))


class Claim(NamedTuple):
    """A key this request holds: its row, and the key itself to seal the answer (never saved)."""

    record: IdempotencyKey
    key: str


def claim(request: Request) -> Claim:
    """Take the request's key, or raise `Replay` with the stored answer, or a 4xx when the key
    is malformed or was used for another request. Must run inside the request's transaction."""
    key = request.META[META_KEY]
    if not KEY_RE.match(key):
        raise DomainError(
            "Idempotency-Key must be 1 to 255 visible ASCII characters (a UUID is a good choice).",
            field=HEADER,
        )
    user: User = request.user  # type: ignore[assignment]  # claimed after authentication
    key_hash = _key_hash(user.pk, key)
    method, path = request.method or "POST", request.get_full_path()
    fingerprint = _fingerprint(request)
    now = timezone.now()
    IdempotencyKey.objects.filter(user=user, created_at__lt=now - TTL).delete()
    stored = None
    for _ in range(2):  # twice: the row we collided with may be gone before we read it
        try:
            with transaction.atomic():
                record = IdempotencyKey.objects.create(
                    user=user, key_hash=key_hash, method=method, path=path, request_hash=fingerprint
                )
                return Claim(record=record, key=key)
        except IntegrityError:
            pass  # a first request holds (or held) this key: its transaction is over now
        stored = IdempotencyKey.objects.filter(user=user, key_hash=key_hash).first()
        if stored is not None:
            break
    if stored is None:
        raise Conflict("Another request with this Idempotency-Key is in flight; retry.")
    if (stored.method, stored.path, stored.request_hash) != (method, path, fingerprint):
        what = (
            "with a different body"
            if (stored.method, stored.path) == (method, path)
            else f"for {stored.method} {stored.path}"
        )
        raise IdempotencyKeyReused(
            f"This Idempotency-Key was already used {what}. Send a new key for a new request."
        )
    raise Replay(_stored_response(stored, key))


def settle(claimed: Claim, response: Response) -> None:
    """Keep a success's answer with its key; forget the key of anything else."""
    record = claimed.record
    if not 200 <= response.status_code < 300:
        record.delete()
        return
    data: Any = getattr(response, "data", None)
    record.status_code = response.status_code
    record.response_sealed = "" if data is None else seal(claimed.key, JSONRenderer().render(data))
    record.location = response.get("Location", "")
    record.save(update_fields=["status_code", "response_sealed", "location"])


def _stored_response(stored: IdempotencyKey, key: str) -> Response:
    headers = {REPLAYED_HEADER: "true"}
    if stored.location:
        headers["Location"] = stored.location
    data = json.loads(unseal(key, stored.response_sealed)) if stored.response_sealed else None
    return Response(data, status=stored.status_code, headers=headers)


class IdempotentPostMixin:
    # For API views: POSTs honour `Idempotency-Key` (see the module's docstring). A keyed POST
    # runs in one transaction: the key's row, what the view writes and the stored answer commit
    # together. The key is claimed after authentication, permissions and throttling, so it is
    # scoped to the authenticated user and a refused request claims nothing. (A comment, not a
    # docstring: the schema would take it as the description of every view that has none.)

    _idempotency: Claim | None = None

    def dispatch(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        if request.method == "POST" and META_KEY in request.META:
            with transaction.atomic():
                return super().dispatch(request, *args, **kwargs)  # type: ignore[misc]
        return super().dispatch(request, *args, **kwargs)  # type: ignore[misc]

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        self._idempotency = None
        super().initial(request, *args, **kwargs)  # type: ignore[misc]
        if request.method == "POST" and META_KEY in request.META:
            self._idempotency = claim(request)

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, Replay):
            return exc.response
        response: Response = super().handle_exception(exc)  # type: ignore[misc]
        return response

    def finalize_response(
        self, request: Request, response: Response, *args: Any, **kwargs: Any
    ) -> Response:
        response = super().finalize_response(request, response, *args, **kwargs)  # type: ignore[misc]
        record, self._idempotency = self._idempotency, None
        if record is not None:
            settle(record, response)
        return response
