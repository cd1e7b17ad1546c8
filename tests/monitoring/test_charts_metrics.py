"""Chart series, cluster overview, pages, and the Prometheus endpoint."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.core.cache import cache
from prometheus_client.parser import text_string_to_metric_families

from monitoring import live
from monitoring.fleet import fleet_snapshot_take, frag_ratio_core, largest_gang
from monitoring.ingest import ingest_samples
from monitoring.models import FleetSnapshot
from monitoring.rollups import flush_rollups
from scheduler.models import Allocation
from tests.monitoring.conftest import feed, hold, sample

pytestmark = pytest.mark.django_db


def chart(body, key):
    return next(c for c in body["charts"] if c["key"] == key)


def test_job_series_live_and_from_rollups(running, api, team, now):
    gpu, job, node = running["gpu"], running["job"], running["node"]
    held_from = now - timedelta(minutes=10)
    Allocation.objects.filter(job=job).update(started_at=held_from)
    at = job.started_at + timedelta(seconds=1)
    ingest_samples(node=node, samples=[sample(gpu, utilization=33.0)], now=at)
    resp = api(team["viewer"]).get(f"/api/v1/monitoring/jobs/{job.pk}/series?range=15m")
    assert resp.status_code == 200
    util = chart(resp.json(), "utilization")
    assert util["series"] == [f"{node.name}/gpu{gpu.index}"] and util["values"] == [[33.0]]
    assert {c["key"] for c in resp.json()["charts"]} == {
        "utilization",
        "memory_used_mib",
        "temperature_c",
        "power_w",
    }
    # samples from before the job held the GPU are not its samples
    ingest_samples(
        node=node,
        samples=[sample(gpu, utilization=99.0)],
        now=held_from - timedelta(minutes=5),
    )
    body = api(team["viewer"]).get(f"/api/v1/monitoring/jobs/{job.pk}/series?range=1h").json()
    assert 99.0 not in chart(body, "utilization")["values"][0]
    # 24 hours come from the minute rollups of this job: samples from its allocation on,
    # and the earlier ones (before it held the GPU) are idle rows, not the job's
    live.clear()
    feed(node, [gpu], start=held_from - timedelta(minutes=3), minutes=2, utilization=77.0)
    feed(node, [gpu], start=held_from + timedelta(seconds=1), minutes=10, utilization=20.0)
    flush_rollups(now=held_from + timedelta(minutes=12))
    body = api(team["member"]).get(f"/api/v1/monitoring/jobs/{job.pk}/series?range=24h").json()
    values = [v for v in chart(body, "utilization")["values"][0] if v is not None]
    assert values and all(v == pytest.approx(20.0) for v in values)


def test_series_refuse_bad_parameters_and_strangers(running, api, team, make_user):
    job, node = running["job"], running["node"]
    bad = api(team["member"]).get(f"/api/v1/monitoring/jobs/{job.pk}/series?range=5y")
    assert bad.status_code == 400 and "range" in bad.json()
    assert api(team["outsider"]).get(f"/api/v1/monitoring/jobs/{job.pk}/series").status_code == 404
    assert api(team["owner"]).get(f"/api/v1/monitoring/nodes/{node.pk}/series").status_code == 403
    assert api(None).get(f"/api/v1/monitoring/jobs/{job.pk}/series").status_code in (401, 403)
    staff = api(make_user(staff=True))
    assert staff.get(f"/api/v1/monitoring/nodes/{node.pk}/series?range=7d").status_code == 200
    assert staff.get("/api/v1/monitoring/nodes/999999/series").status_code == 404
    assert staff.get("/api/v1/monitoring/cluster?range=2h").status_code == 400
    assert staff.get("/api/v1/monitoring/alerts?state=maybe").status_code == 400
    assert staff.get("/api/v1/monitoring/alerts?rule=nope").status_code == 400


def test_node_series_has_every_gpu(running, api, make_user, now):
    node = running["node"]
    gpus = list(node.gpus.order_by("index"))
    ingest_samples(
        node=node,
        samples=[sample(g, utilization=10.0 * (i + 1)) for i, g in enumerate(gpus)],
        now=now,
    )
    body = api(make_user(staff=True)).get(f"/api/v1/monitoring/nodes/{node.pk}/series").json()
    util = chart(body, "utilization")
    assert util["series"] == [f"gpu{g.index}" for g in gpus]
    assert [v[-1] for v in util["values"]] == [10.0, 20.0]


def test_cluster_overview_is_staff_only_with_bounded_queries(
    running, api, make_user, team, now, django_assert_max_num_queries, fleet
):
    for name in ("h1", "h2", "l1"):
        node = fleet["nodes"][name]
        ingest_samples(node=node, samples=[sample(g) for g in node.gpus.all()], now=now)
    fleet_snapshot_take(now=now)
    staff = api(make_user(staff=True))
    assert api(team["owner"]).get("/api/v1/monitoring/cluster").status_code == 403
    with django_assert_max_num_queries(8):
        resp = staff.get("/api/v1/monitoring/cluster?range=1h")
    assert resp.status_code == 200
    body = resp.json()
    models = {m["model"]: m for m in body["models"]}
    assert models["H100-80GB-SXM"]["total"] == 4 and models["H100-80GB-SXM"]["free"] == 3
    # 2 free on one node and 1 on the other: an equal-width gang gets 2 (1 × 2 or 2 × 1)
    assert models["H100-80GB-SXM"]["largest_gang"] == 2
    assert models["L4"]["free"] == 4 and models["L4"]["gang_shape"] == [1, 4]
    hm = body["heatmap"]
    assert sum(n[3] for n in hm["nodes"]) == len(hm["gpu"]) == 8
    assert [n[1] for n in hm["nodes"]] == ["h1", "h2", "l1"]
    assert sum(1 for used in hm["used_milli"] if used > 0) == 1
    assert hm["util"] == [50.0] * 8
    assert [hm["models"][m] for m in hm["model"]] == ["H100-80GB-SXM"] * 4 + ["L4"] * 4
    assert {hm["healths"][h] for h in hm["health"]} == {"healthy"}
    assert body["fragmentation"] is not None
    assert {c["key"] for c in body["charts"]} == {"util", "held", "frag"}
    held = chart(body, "held")
    assert held["series"] == ["H100-80GB-SXM", "L4"] and held["values"][0][-1] == 25.0
    # more nodes and GPUs do not mean more queries
    from scheduler.seed import node_register_simulated

    for i in range(5):
        node_register_simulated(
            name=f"x{i}",
            pool=fleet["pool"],
            gpu_model=fleet["h100"],
            gpu_count=8,
            cpu_milli=1000,
            memory_mib=1000,
        )
    with django_assert_max_num_queries(8):
        assert staff.get("/api/v1/monitoring/cluster?range=24h").status_code == 200


def test_largest_gang_and_fleet_snapshot(fleet, now):
    assert largest_gang({1: 8, 2: 3, 3: 3}) == (9, (3, 3))
    assert largest_gang({}) == (0, (0, 0))
    gpu = fleet["nodes"]["h1"].gpus.first()
    hold(gpu, now=now)
    rows = {s.model_name: s for s in fleet_snapshot_take(now=now)}
    assert rows["H100-80GB-SXM"].free_gpus == 3 and rows["H100-80GB-SXM"].largest_node_block == 2
    assert rows[""].total_gpus == 8 and 0.0 <= rows[""].frag_ratio <= 100.0
    assert frag_ratio_core(now=now) is not None  # the scheduler core's FGD measure answers
    fleet_snapshot_take(now=now)  # the same minute again replaces it
    assert FleetSnapshot.objects.filter(model_name="").count() == 1


def test_pages_render_charts_and_refuse_non_operators(running, client, team, make_user):
    client.force_login(team["member"])
    html = client.get(f"/jobs/{running['job'].pk}/").content.decode()
    assert "uPlot.iife.min.js" in html and "gpu-charts.js" in html
    assert (
        f"/api/v1/monitoring/jobs/{running['job'].pk}/series" in html and 'hx-swap="none"' in html
    )
    assert 'data-push="telemetry"' in html and "cdn" not in html.lower()  # pushed, or polled
    assert client.get("/monitoring/").status_code == 403
    assert client.get("/monitoring/alerts/").status_code == 403
    assert client.get("/monitoring/notifications/").status_code == 200
    client.force_login(make_user(staff=True))
    page = client.get("/monitoring/")
    assert page.status_code == 200 and "data-gpu-heatmap" in page.content.decode()
    assert client.get("/monitoring/?range=nope").status_code == 400
    node_html = client.get(f"/ops/nodes/{running['node'].pk}/").content.decode()
    assert f"/api/v1/monitoring/nodes/{running['node'].pk}/series" in node_html
    assert client.get("/monitoring/alerts/?state=all").status_code == 200
    assert client.get("/monitoring/alerts/?state=bad").status_code == 400


def test_vendored_uplot_is_served_locally():
    root = Path(django_settings.BASE_DIR) / "static"
    assert (root / "vendor/uplot/uPlot.iife.min.js").stat().st_size > 10_000
    assert "MIT" in (root / "vendor/uplot/LICENSE").read_text()
    js = (root / "js/gpu-charts.js").read_text()
    assert "setData" in js and "htmx:afterRequest" in js


# ------------------------------------------------------------------ /metrics
def scrape(client, **headers):
    return client.get("/monitoring/metrics", **headers)


def test_metrics_need_a_token_or_an_allowed_address(client, settings, fleet):
    settings.METRICS_TOKEN = "s3cret-token"
    settings.METRICS_ALLOWED_IPS = []
    assert scrape(client).status_code == 403
    assert scrape(client, HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    assert scrape(client, HTTP_AUTHORIZATION="Bearer s3cret-token").status_code == 200
    settings.METRICS_TOKEN = ""
    assert (
        scrape(client, HTTP_AUTHORIZATION="Bearer ").status_code == 403
    )  # empty token never matches
    settings.METRICS_ALLOWED_IPS = ["10.0.0.0/8", "not-an-ip", "127.0.0.1"]
    assert scrape(client).status_code == 200
    assert scrape(client, REMOTE_ADDR="10.1.2.3").status_code == 200
    assert scrape(client, REMOTE_ADDR="192.168.1.1").status_code == 403
    assert client.post("/monitoring/metrics").status_code in (403, 405)


def test_metrics_expose_dcgm_names_labels_and_portal_metrics(running, client, settings, now, team):
    settings.METRICS_ALLOWED_IPS = ["127.0.0.1"]
    node, gpu, job = running["node"], running["gpu"], running["job"]
    ingest_samples(
        node=node,
        samples=[sample(gpu, utilization=77.0, memory_used_mib=2048, xid_events=[13])],
        now=now,
    )
    cache.set(settings.MONITORING_CYCLE_CACHE_KEY, {"seconds": 0.042, "at": now.timestamp()})
    from scheduler.models import Job, JobState

    Job.objects.create(
        project=team["a"],
        submitted_by=team["member"],
        name="q",
        command="true",
        state=JobState.QUEUED,
        gpu_model=running["gpu"].model,
        queued_at=now - timedelta(minutes=3),
    )
    fleet_snapshot_take(now=now)
    resp = scrape(client)
    assert resp.status_code == 200 and resp["Content-Type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(resp.content.decode())}
    util = families["DCGM_FI_DEV_GPU_UTIL"]
    (s,) = [s for s in util.samples if s.labels["UUID"] == gpu.uuid]
    assert s.value == 77.0
    assert s.labels["gpu"] == str(gpu.index) and s.labels["Hostname"] == node.name
    assert s.labels["modelName"] == "H100-80GB-SXM" and s.labels["hpc_job"] == str(job.pk)
    for name in (
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_FB_FREE",
    ):
        assert families[name].type == "gauge" and families[name].samples
    assert [x.value for x in families["DCGM_FI_DEV_XID_ERRORS"].samples] == [13.0]
    queue = {x.labels["gpu_model"]: x.value for x in families["gpucloud_queue_jobs"].samples}
    assert queue == {"H100-80GB-SXM": 1.0}
    (wait,) = families["gpucloud_queue_wait_seconds_max"].samples
    assert 170 <= wait.value <= 400
    allocs = {
        x.labels["gpu_model"]: x.value for x in families["gpucloud_allocations_active"].samples
    }
    assert allocs == {"H100-80GB-SXM": 1.0}
    assert families["gpucloud_scheduling_cycle_seconds"].samples[0].value == 0.042
    assert families["gpucloud_fragmentation_ratio"].samples
    free = {x.labels["gpu_model"]: x.value for x in families["gpucloud_gpus_free"].samples}
    assert free == {"H100-80GB-SXM": 3.0, "L4": 4.0}


def test_grafana_dashboard_queries_only_metrics_we_expose(running, now):
    import json
    import re

    from monitoring.metrics import exposition

    ingest_samples(node=running["node"], samples=[sample(running["gpu"])], now=now)
    exposed = {f.name for f in text_string_to_metric_families(exposition(now=now).decode())}
    dash = json.loads((Path(django_settings.BASE_DIR) / "docs/grafana-dashboard.json").read_text())
    used = {
        name
        for panel in dash["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\b(DCGM_FI_\w+|gpucloud_\w+)", target["expr"])
    }
    assert len(used) >= 15 and used <= exposed, used - exposed


def test_cluster_overview_is_computed_once_per_cache_window_for_all_operators(
    fleet, api, make_user, now, settings, django_assert_max_num_queries
):
    settings.MONITORING_OVERVIEW_CACHE_S = 60
    node = fleet["nodes"]["h1"]
    ingest_samples(
        node=node, samples=[sample(g, utilization=10.0) for g in node.gpus.all()], now=now
    )
    first = api(make_user(staff=True)).get("/api/v1/monitoring/cluster").json()
    ingest_samples(
        node=node, samples=[sample(g, utilization=90.0) for g in node.gpus.all()], now=now
    )
    other = api(make_user(staff=True))
    with django_assert_max_num_queries(0):  # another operator, inside the window: shared result
        again = other.get("/api/v1/monitoring/cluster").json()
    assert again == first and 10.0 in first["heatmap"]["util"]
    settings.MONITORING_OVERVIEW_CACHE_S = 0  # no sharing: computed now, with the new samples
    fresh = api(make_user(staff=True)).get("/api/v1/monitoring/cluster").json()
    assert 90.0 in fresh["heatmap"]["util"] and 10.0 not in fresh["heatmap"]["util"]
