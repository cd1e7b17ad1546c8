"""The availability table (dashboard, submit form) is never computed on a page request once it
exists: an old copy is served while the Celery worker computes the next one."""

from __future__ import annotations

import pytest
from django.core.cache import cache

from scheduler.estimates import AVAILABILITY_KEY, model_availability
from scheduler.models import Gpu
from tests.polling import wait_for


@pytest.mark.celery
@pytest.mark.django_db(transaction=True)
def test_an_old_copy_is_served_while_the_worker_computes_the_next(fleet, celery_live_worker):
    first = {a.model.name: a.total_gpus for a in model_availability()}
    assert first["H100-80GB-SXM"] == 4
    computed_at = cache.get(AVAILABILITY_KEY)["at"]
    Gpu.objects.filter(node__name="h2").update(health=Gpu.Health.UNHEALTHY)
    # still fresh: the same copy, nothing recomputed
    assert {a.model.name: a.total_gpus for a in model_availability()} == first
    # make the copy old: the next page gets it at once, and the worker replaces it
    cache.set(AVAILABILITY_KEY, {**cache.get(AVAILABILITY_KEY), "at": computed_at - 60}, 300)
    assert {a.model.name: a.total_gpus for a in model_availability()} == first
    wait_for(lambda: cache.get(AVAILABILITY_KEY)["at"] > computed_at, timeout=20)
    now = {a.model.name: a.total_gpus for a in model_availability()}
    assert now["H100-80GB-SXM"] == 2


@pytest.mark.django_db
def test_a_cold_cache_is_computed_on_the_spot(fleet):
    assert cache.get(AVAILABILITY_KEY) is None
    assert any(a.total_gpus for a in model_availability())
    assert cache.get(AVAILABILITY_KEY) is not None
