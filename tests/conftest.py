"""Shared fixtures: people, projects with roles, API clients."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable

import pytest
from rest_framework.test import APIClient

from portal.models import Membership, Project, Role, User
from portal.services import project_create

_seq = itertools.count(1)

# The embedded lane runs under its own settings (scripts/test.sh), never in the main suite.
if os.environ.get("DJANGO_SETTINGS_MODULE") != "config.settings.embedded_test":
    collect_ignore = ["embedded"]


@pytest.fixture
def make_user(db: None) -> Callable[..., User]:
    def make(email: str | None = None, *, staff: bool = False, password: str = "pw-123456") -> User:
        email = email or f"user{next(_seq)}@example.org"
        return User.objects.create_user(email, password, is_staff=staff)

    return make


@pytest.fixture
def make_project(make_user: Callable[..., User]) -> Callable[..., Project]:
    def make(slug: str | None = None, *, owner: User | None = None) -> Project:
        slug = slug or f"proj-{next(_seq)}"
        return project_create(owner=owner or make_user(), slug=slug, name=slug.title())

    return make


@pytest.fixture
def team(make_user: Callable[..., User], make_project: Callable[..., Project]) -> dict[str, object]:
    """Project A with an owner, a member and a viewer; project B with its own owner."""
    owner, member, viewer, outsider = (make_user() for _ in range(4))
    a = make_project("alpha", owner=owner)
    Membership.objects.create(project=a, user=member, role=Role.MEMBER)
    Membership.objects.create(project=a, user=viewer, role=Role.VIEWER)
    b = make_project("beta", owner=outsider)
    return {
        "a": a,
        "b": b,
        "owner": owner,
        "member": member,
        "viewer": viewer,
        "outsider": outsider,
    }


@pytest.fixture
def api() -> Callable[[User | None], APIClient]:
    def client_for(user: User | None = None) -> APIClient:
        client = APIClient()
        if user is not None:
            client.force_authenticate(user)
        return client

    return client_for


@pytest.fixture
def fleet(db):
    """Catalog, a pool, and nodes: two with 2 × H100 each, one with 4 × L4 time-sliced ×2."""
    from scheduler.models import Gpu, GpuModel, Pool
    from scheduler.nodes import node_issue_agent_token
    from scheduler.seed import catalog_seed, node_register_simulated

    catalog_seed()
    pool, _ = Pool.objects.get_or_create(name="default")
    h100 = GpuModel.objects.get(name="H100-80GB-SXM")
    l4 = GpuModel.objects.get(name="L4")
    nodes = {
        "h1": node_register_simulated(
            name="h1",
            pool=pool,
            gpu_model=h100,
            gpu_count=2,
            cpu_milli=64_000,
            memory_mib=512_000,
            state="ready",
        ),
        "h2": node_register_simulated(
            name="h2",
            pool=pool,
            gpu_model=h100,
            gpu_count=2,
            cpu_milli=64_000,
            memory_mib=512_000,
            state="ready",
        ),
        "l1": node_register_simulated(
            name="l1",
            pool=pool,
            gpu_model=l4,
            gpu_count=4,
            cpu_milli=64_000,
            memory_mib=512_000,
            sharing_mode=Gpu.SharingMode.TIME_SLICE,
            oversubscription=2,
            state="ready",
        ),
    }
    tokens = {name: node_issue_agent_token(node=node) for name, node in nodes.items()}
    return {"pool": pool, "nodes": nodes, "tokens": tokens, "h100": h100, "l4": l4}


@pytest.fixture(scope="session", autouse=True)
def _clean_test_broker_keys():
    """Remove this run's broker keys (they carry a per-run prefix) from the shared Redis."""
    yield
    from django.conf import settings

    from foundation.locks import redis_client

    prefix = settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("global_keyprefix")
    if settings.REDIS_URL and prefix:
        client = redis_client()
        keys = list(client.scan_iter(f"{prefix}*"))
        if keys:
            client.delete(*keys)


from tests.celery_fixtures import celery_live_worker  # noqa: E402,F401


@pytest.fixture(autouse=True)
def _fresh_short_lived_cache():
    """Cached views of the cluster must not leak from one test's fleet into the next."""
    from django.core.cache import cache

    keys = [
        "scheduler:model-availability",
        "scheduler:model-availability-refreshing",
        "scheduler:cycle-requested",
    ]
    cache.delete_many(keys)
    yield
    cache.delete_many(keys)


from tests.stack_fixtures import agents  # noqa: E402,F401


@pytest.fixture
def ckpt_volume(team: dict[str, object]) -> object:
    """A shared volume `ckpt` in project A (jobs checkpoint to "ckpt:<path>")."""
    from storage.models import Volume, VolumeKind

    return Volume.objects.create(
        project=team["a"], name="ckpt", kind=VolumeKind.SHARED, size_gib=10
    )
