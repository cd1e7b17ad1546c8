"""The price list in memory: which version is in effect for a GPU model at a moment."""

from __future__ import annotations

import bisect
from collections import defaultdict
from datetime import datetime

from billing.models import PriceVersion
from billing.pricing import floor_second


class PriceTable:
    """All price versions, loaded once per metering run (the list is small)."""

    def __init__(self, versions: list[PriceVersion]) -> None:
        self._by_model: dict[int, list[PriceVersion]] = defaultdict(list)
        for version in sorted(versions, key=lambda v: (v.gpu_model_id, v.effective_from)):
            self._by_model[version.gpu_model_id].append(version)
        # a version takes effect at a whole second (truncated): slices are whole seconds, so
        # a start inside a second would drop the part of a second before it from both slices
        self._starts = {
            model: [floor_second(v.effective_from) for v in rows]
            for model, rows in self._by_model.items()
        }

    @classmethod
    def load(cls) -> PriceTable:
        return cls(list(PriceVersion.objects.all()))

    def at(self, gpu_model_id: int, moment: datetime) -> PriceVersion | None:
        starts = self._starts.get(gpu_model_id)
        if not starts:
            return None
        i = bisect.bisect_right(starts, moment) - 1
        return self._by_model[gpu_model_id][i] if i >= 0 else None

    def changes_within(self, gpu_model_id: int, start: datetime, end: datetime) -> list[datetime]:
        """Moments strictly inside (start, end) where the model's price changes."""
        return [s for s in self._starts.get(gpu_model_id, []) if start < s < end]
