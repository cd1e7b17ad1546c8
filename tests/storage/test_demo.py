"""`make run`'s demo project has a shared volume and a small dataset, seeded once."""

from __future__ import annotations

import hashlib

import pytest
from django.core.management import call_command

from storage.models import FillState, Volume

pytestmark = pytest.mark.django_db


def test_the_demo_project_has_a_volume_and_a_dataset(shared_root):
    call_command("seed_demo", verbosity=0)
    call_command("seed_demo", verbosity=0)  # idempotent
    volumes = {v.name: v for v in Volume.objects.filter(project__slug="vision-lab")}
    assert set(volumes) == {"checkpoints", "iris"}
    assert volumes["checkpoints"].kind == "shared" and not volumes["checkpoints"].is_dataset
    iris = volumes["iris"]
    assert iris.is_dataset and iris.fill_state == FillState.READY
    stored = (shared_root / f"v{iris.pk}" / "iris.csv").read_bytes()
    assert stored.startswith(b"sepal_length,") and len(stored) == iris.size_bytes
    assert iris.sha256 == hashlib.sha256(stored).hexdigest()
