"""Ports: what storage needs to know from the apps above it (it imports none of them).

The scheduler registers `VOLUME_IN_USE` in its `AppConfig.ready()` to say which of some
volumes active jobs mount; until it does, no volume is in use (storage alone cannot know).
mypy checks the registration against the Protocol.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import Generic, Protocol, TypeVar


class VolumeInUse(Protocol):
    """Of these volumes, those that active jobs mount: volume id → the ids of those jobs."""

    def __call__(self, *, volume_ids: Collection[int]) -> Mapping[int, list[int]]: ...


def nothing_in_use(*, volume_ids: Collection[int]) -> Mapping[int, list[int]]:
    return {}


T = TypeVar("T")


class DefaultedPort(Generic[T]):
    """One implementation of a Protocol, registered by the app above; a default until then."""

    def __init__(self, name: str, default: T) -> None:
        self.name = name
        self._default = default
        self._impl: T | None = None

    def register(self, impl: T) -> None:
        self._impl = impl

    def get(self) -> T:
        return self._impl if self._impl is not None else self._default

    @contextmanager
    def override(self, impl: T | None) -> Iterator[None]:
        """Another implementation (None: the default) for the duration of a block: tests."""
        saved, self._impl = self._impl, impl
        try:
            yield
        finally:
            self._impl = saved


VOLUME_IN_USE: DefaultedPort[VolumeInUse] = DefaultedPort("volume in use", nothing_in_use)
