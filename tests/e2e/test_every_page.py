"""Every page in one browser session at 1400 × 1000, as an operator (who sees them all):
chart boxes inside their cells right after load, no empty chart with a 1970 axis, no raw
reason or state code in any page's text, a navigation bar that does not wrap and leads to the
cluster overview and alerts, and API docs in the portal's look with the public API first."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.apps import apps
from django.core.management import call_command
from django.utils import timezone

from agent.protocol import FAILURE_TEXT
from scheduler.core.reasons import PendingReason
from scheduler.models import DependencyKind

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# Right after load: every drawn chart inside its cell, each plot's time axis on its samples.
CHARTS = """() => [...document.querySelectorAll('.mon-chart')].filter(c => !c.hidden).map(c => {
  const cell = c.getBoundingClientRect(), drawn = c.querySelector('.uplot');
  const box = drawn && drawn.getBoundingClientRect();
  return {key: c.dataset.chartKey, drawn: !!drawn,
          inside: !!box && box.left >= cell.left - 1 && box.right <= cell.right + 1,
          xmin: c._plot ? c._plot.scales.x.min : null};
})"""
# The page's words, without code samples, form controls and the embedded Swagger UI.
TEXT = """() => { const main = (document.querySelector('main') || document.body).cloneNode(true);
  main.querySelectorAll('code, pre, kbd, samp, script, style, textarea, select, input, .swagger-ui')
      .forEach(n => n.remove());
  const header = document.querySelector('header');
  return (header ? header.innerText : '') + '\\n' + main.innerText; }"""


def raw_codes() -> set[str]:
    """Every snake_case value the portal stores as a code: pending reasons, model choices
    (states, end reasons, event kinds...), the agent's failure reasons."""
    codes = {str(r.value) for r in PendingReason} | set(FAILURE_TEXT)
    for model in apps.get_models():
        for field in model._meta.get_fields():
            for value, _label in getattr(field, "flatchoices", None) or ():
                codes.add(str(value))
    # Dependency kinds are also what researchers type (after_ok:12), so the form explains them.
    codes -= {str(value) for value in DependencyKind.values}
    return {c for c in codes if re.fullmatch(r"[a-z0-9]+(_[a-z0-9]+)+", c)}


def _scene():
    """The demo, one job running with telemetry, one waiting with none, one node drained."""
    from rest_framework.test import APIClient

    from monitoring.ingest import ingest_samples
    from portal.models import User
    from scheduler.cycle import run_cycle
    from scheduler.models import Allocation, Job, JobState, Node
    from scheduler.nodes.operator import node_set_state
    from scheduler.transitions import job_transition

    call_command("seed_demo", verbosity=0)
    Node.objects.update(state="ready", last_heartbeat_at=timezone.now())
    researcher = User.objects.get(email="researcher@gpucloud.example")
    api = APIClient()
    api.force_authenticate(researcher)
    submit = {"project": "vision-lab", "name": "train", "command": "true"}
    running = api.post("/api/v1/jobs", {**submit, "gpus": 1}, format="json").json()["id"]
    run_cycle()
    job = Job.objects.get(pk=running)
    job_transition(job=job, to=JobState.RUNNING, reason="Started")
    alloc = Allocation.objects.filter(job=job).select_related("node").first()
    now = timezone.now()
    for age in (40, 30, 20, 10, 0):
        sample = {"gpu_id": alloc.gpu_id, "utilization": 60.0 + age, "memory_used_mib": 2000}
        ingest_samples(node=alloc.node, samples=[sample], now=now - timedelta(seconds=age))
    waiting = api.post("/api/v1/jobs", {**submit, "gpus": 8}, format="json").json()["id"]
    operator = User.objects.get(email="operator@gpucloud.example")
    busy = Allocation.objects.filter(ended_at__isnull=True).values("node_id")
    idle = Node.objects.exclude(pk__in=busy).order_by("pk")
    node_set_state(actor=operator, node=idle.first(), action="drain")
    run_cycle()
    return {"running": running, "waiting": waiting, "node": alloc.node_id}


def test_every_page_at_1400_by_1000(page):
    scene = _scene()
    codes = raw_codes()
    assert {"no_matching_gpu", "nodes_unavailable"} <= codes
    page.set_viewport_size({"width": 1400, "height": 1000})
    page.goto("/login/")
    page.fill("#id_username", "operator@gpucloud.example")
    page.fill("#id_password", "operator-demo-pass")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r".*/$"))

    pages = [
        "/",
        "/jobs/",
        "/jobs/new/",
        f"/jobs/{scene['running']}/",
        f"/jobs/{scene['waiting']}/",
        "/gpus/",
        "/tokens/",
        "/account/",
        "/projects/vision-lab/",
        "/projects/vision-lab/requests/",
        "/projects/vision-lab/audit/",
        "/billing/projects/vision-lab/usage/",
        "/billing/projects/vision-lab/invoices/",
        "/billing/operator/revenue/",
        "/monitoring/",
        "/monitoring/alerts/",
        "/monitoring/efficiency/",
        "/monitoring/efficiency/vision-lab/",
        "/monitoring/notifications/",
        "/ops/nodes/",
        f"/ops/nodes/{scene['node']}/",
        "/ops/pools/",
        "/ops/requests/",
        "/api/docs/",
    ]
    problems: list[str] = []
    for url in pages:
        response = page.goto(url)
        assert response is not None and response.ok, (url, response and response.status)
        if page.locator("[data-gpu-charts], [data-cluster]").count():
            # charts drawn, or the status saying there is nothing to draw
            page.wait_for_function(
                """() => document.querySelector('.mon-chart .uplot') ||
                   [...document.querySelectorAll('[data-chart-status]')].some(s => s.textContent)"""
            )
        for chart in page.evaluate(CHARTS):
            if not chart["inside"]:
                problems.append(f"{url}: chart {chart['key']} spills out of its cell")
            if chart["xmin"] is None or chart["xmin"] < 1e9:
                problems.append(f"{url}: chart {chart['key']} has no time axis of its samples")
        text = page.evaluate(TEXT)
        shown = sorted(c for c in codes if re.search(rf"\b{c}\b", text))
        if shown:
            problems.append(f"{url}: raw codes {shown}")
        bar = page.locator("header.topbar")
        if not bar.count() or bar.bounding_box()["height"] > 60:
            problems.append(f"{url}: no portal navigation bar on one line")
    assert not problems, "\n".join(problems)

    # The waiting job: no charts, "No telemetry yet"; it waits for GPUs, in words.
    page.goto(f"/jobs/{scene['waiting']}/")
    page.wait_for_function(
        "() => document.querySelector('[data-chart-status]').textContent === 'No telemetry yet.'"
    )
    assert page.locator(".mon-chart .uplot").count() == 0
    # The running job's three charts are drawn, side by side, each in its cell.
    page.goto(f"/jobs/{scene['running']}/")
    page.wait_for_function("() => document.querySelectorAll('.mon-chart .uplot').length >= 2")
    assert all(c["inside"] for c in page.evaluate(CHARTS))

    # The operators' menu leads to the cluster overview and the alerts.
    page.click("[data-testid=ops-menu] summary")
    page.click("[data-testid=ops-menu] >> text=Cluster overview")
    page.wait_for_url("**/monitoring/")
    page.click("[data-testid=ops-menu] summary")
    page.click("[data-testid=ops-menu] >> text=Alerts")
    page.wait_for_url("**/monitoring/alerts/")

    # API docs: the portal's header, the public API before the agents' internal endpoints.
    page.goto("/api/docs/")
    page.wait_for_selector(".swagger-ui .opblock-tag")
    assert page.locator("header.topbar .brand").is_visible()
    tags = page.locator(".swagger-ui .opblock-tag").all_inner_texts()
    assert tags[0].startswith("Portal API") and tags[-1].startswith("Node agents"), tags
