"""The planner's per-cycle caches, each a small typed object.

Answers that depend on the cluster's free GPUs or on usage hold only until placed work changes
them: the planner bumps its `StateEpoch` then, and an `EpochCache`/`EpochSet` forgets what it
held before (instead of every key carrying the epoch by hand). `Memo` holds answers that
depend on the request alone and stay valid for the whole cycle.
"""

from __future__ import annotations

from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class StateEpoch:
    """Counts changes of the planner's cluster state (placements, shrinks)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def bump(self) -> None:
        self.value += 1


class EpochCache(Generic[K, V]):
    """Answers valid while the cluster state they came from is unchanged."""

    __slots__ = ("_epoch", "_items", "_seen")

    def __init__(self, epoch: StateEpoch) -> None:
        self._epoch = epoch
        self._seen = epoch.value
        self._items: dict[K, V] = {}

    def _fresh(self) -> dict[K, V]:
        if self._seen != self._epoch.value:
            self._items.clear()
            self._seen = self._epoch.value
        return self._items

    def get(self, key: K) -> V | None:
        if self._seen != self._epoch.value:
            return self._fresh().get(key)
        return self._items.get(key)

    def put(self, key: K, value: V) -> V:
        self._fresh()[key] = value
        return value


class EpochSet(Generic[K]):
    """Keys known (e.g. "does not fit") while the cluster state is unchanged."""

    __slots__ = ("_epoch", "_items", "_seen")

    def __init__(self, epoch: StateEpoch) -> None:
        self._epoch = epoch
        self._seen = epoch.value
        self._items: set[K] = set()

    def _fresh(self) -> set[K]:
        if self._seen != self._epoch.value:
            self._items.clear()
            self._seen = self._epoch.value
        return self._items

    def __contains__(self, key: K) -> bool:
        if self._seen != self._epoch.value:
            return key in self._fresh()
        return key in self._items

    def add(self, key: K) -> None:
        self._fresh().add(key)


class Memo(Generic[K, V]):
    """Answers valid for the whole cycle."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: dict[K, V] = {}

    def get(self, key: K) -> V | None:
        return self._items.get(key)

    def put(self, key: K, value: V) -> V:
        self._items[key] = value
        return value
