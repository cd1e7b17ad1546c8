"""Container images: which registry an image reference names, whether it is allowed, and the
curated images warm nodes keep pulled.

Fast path: the curated images every heartbeat answer lists are a compiled read
(`_KEPT_PULLED`, `foundation.db.CompiledQuery`); measured by `bench.agent_cost`.
"""

from __future__ import annotations

import re

from django.conf import settings

from foundation.db import CompiledQuery
from portal.errors import DomainError
from scheduler.models import AllowedRegistry, CuratedImage

DEFAULT_REGISTRY = "docker.io"
# name[:tag][@digest], lower-case path components (the OCI distribution spec's grammar, loosely)
_REFERENCE = re.compile(
    r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?$"
)


def image_registry(reference: str) -> str:
    """The registry an image reference pulls from: its first component when that names a
    host (a dot, a port or `localhost`), else Docker Hub."""
    first, slash, _ = reference.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first
    return DEFAULT_REGISTRY


def image_check(reference: str) -> None:
    """Refuse an image reference that is malformed or from a registry not allowed (field
    `image`, the message naming the image and its registry)."""
    if not reference:
        return
    if len(reference) > 300 or not _REFERENCE.match(reference):
        raise DomainError(
            f"'{reference[:100]}' is not an image reference (e.g. nvcr.io/nvidia/pytorch:24.05-py3).",
            field="image",
        )
    registry = image_registry(reference)
    allowed = sorted(
        {*settings.IMAGE_REGISTRIES, *AllowedRegistry.objects.values_list("host", flat=True)}
    )
    if registry not in allowed:
        raise DomainError(
            f"Image '{reference}' comes from registry '{registry}', which is not allowed; "
            f"allowed: {', '.join(allowed) or 'none'}.",
            field="image",
        )


_KEPT_PULLED = CompiledQuery(
    lambda: (
        CuratedImage.objects.filter(is_active=True).order_by("reference").values_list("reference")
    )
)


def images_to_keep_pulled() -> list[str]:
    """The curated images warm nodes keep pulled (told in every heartbeat answer)."""
    return [reference for (reference,) in _KEPT_PULLED.rows()]


def curated_image_list() -> list[CuratedImage]:
    """The curated images the submit form offers (name, CUDA and framework versions)."""
    return list(CuratedImage.objects.filter(is_active=True))
