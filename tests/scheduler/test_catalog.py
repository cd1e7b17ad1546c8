"""The GPU catalog: seeded with real products, filterable by memory and precision."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.core.management import call_command

from scheduler.models import GpuModel, Node
from scheduler.seed import catalog_seed

pytestmark = pytest.mark.django_db

REQUIRED = {
    "H200-141GB",
    "H100-80GB-SXM",
    "A100-80GB",
    "A100-40GB",
    "L40S",
    "L4",
    "A10",
    "T4",
    "V100-32GB",
}


@pytest.fixture
def catalog(db):
    catalog_seed()


def test_seed_has_the_required_products_with_specs(catalog):
    models = {m.name: m for m in GpuModel.objects.all()}
    assert set(models) >= REQUIRED
    h100 = models["H100-80GB-SXM"]
    assert (h100.memory_gb, h100.compute_capability, h100.architecture) == (80, "9.0", "Hopper")
    assert "fp8" in h100.precisions and h100.mig_profiles[-1] == "7g.80gb"
    assert "bf16" not in models["T4"].precisions
    assert models["L4"].mig_profiles == []


def test_seed_is_idempotent_and_keeps_edited_prices(catalog):
    GpuModel.objects.filter(name="T4").update(price_per_gpu_hour=Decimal("0.35"))
    assert catalog_seed() == 0
    assert GpuModel.objects.get(name="T4").price_per_gpu_hour == Decimal("0.35")


def test_api_filters_by_memory_and_precision(catalog, make_user, api):
    client = api(make_user())
    names = {
        m["name"] for m in client.get("/api/v1/gpu-models/?min_memory_gb=80&precision=fp8").json()
    }
    assert names == {"H200-141GB", "H100-80GB-SXM"}
    names = {m["name"] for m in client.get("/api/v1/gpu-models/?precision=bf16").json()}
    assert "T4" not in names and "V100-32GB" not in names and "L4" in names


def test_api_bad_filter_is_400(catalog, make_user, api):
    client = api(make_user())
    resp = client.get("/api/v1/gpu-models/?min_memory_gb=lots")
    assert resp.status_code == 400 and "min_memory_gb" in resp.json()
    resp = client.get("/api/v1/gpu-models/?precision=fp4")
    assert resp.status_code == 400 and "precision" in resp.json()


def test_catalog_page_filters_and_htmx_partial(catalog, make_user, client):
    client.force_login(make_user())
    page = client.get("/gpus/?min_memory_gb=48").content.decode()
    assert "A100-80GB" in page and "L4 24GB" not in page and "<html" in page
    partial = client.get("/gpus/?precision=fp64", HTTP_HX_REQUEST="true")
    body = partial.content.decode()
    assert "<html" not in body and "V100-32GB" in body and "L40S" not in body
    assert "HX-Request" in partial["Vary"]


def test_demo_seed_builds_fleet_and_accounts(db):
    call_command("seed_demo", verbosity=0)
    call_command("seed_demo", verbosity=0)  # idempotent
    # Nodes wait for their agents to register before they take work.
    assert Node.objects.filter(state=Node.State.PROVISIONING).count() == 6
    from portal.models import Project, User

    researcher = User.objects.get(email="researcher@gpucloud.example")
    assert set(researcher.projects.values_list("slug", flat=True)) == {"vision-lab", "nlp-lab"}
    assert User.objects.get(email="operator@gpucloud.example").is_staff
    assert Project.objects.count() == 2
