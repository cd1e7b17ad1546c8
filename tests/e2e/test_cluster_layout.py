"""The operator's cluster overview in a real browser: live, and every chart inside its card
at a wide and a narrow window (uPlot draws at a fixed width, so a wrong one spills over)."""

from __future__ import annotations

import re

import pytest
from django.core.management import call_command
from django.utils import timezone

from monitoring.ingest import ingest_samples

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

CHARTS_INSIDE_THEIR_CARDS = """() => [...document.querySelectorAll('.mon-chart')]
  .filter(chart => !chart.hidden).map(chart => {
  const card = chart.closest('.card').getBoundingClientRect();
  const drawn = chart.querySelector('.uplot').getBoundingClientRect();
  return {key: chart.dataset.chartKey, inside: drawn.left >= card.left && drawn.right <= card.right};
})"""


def _heartbeats() -> None:
    """A minute of telemetry from every demo GPU: charts are drawn only from samples."""
    from scheduler.models import Gpu

    now = timezone.now()
    for node_id in Gpu.objects.values_list("node_id", flat=True).distinct():
        gpus = Gpu.objects.filter(node_id=node_id).select_related("node")
        node = gpus[0].node
        samples = [
            {"gpu_id": g.pk, "utilization": 30.0, "memory_used_mib": 100, "age_s": age}
            for g in gpus
            for age in (60, 40, 20, 0)
        ]
        ingest_samples(node=node, samples=samples, now=now)


def test_cluster_overview_is_live_and_its_charts_fit(page):
    call_command("seed_demo", verbosity=0)
    _heartbeats()
    page.set_viewport_size({"width": 1300, "height": 900})
    page.goto("/login/")
    page.fill("#id_username", "operator@gpucloud.example")
    page.fill("#id_password", "operator-demo-pass")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r".*/$"))
    page.goto("/monitoring/")
    page.wait_for_function("() => document.querySelectorAll('.mon-chart .uplot').length >= 2")
    # the page head says when the overview was last refreshed
    page.wait_for_function("() => /\\d/.test(document.querySelector('[data-updated]').textContent)")
    for width in (1300, 820):
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(300)  # the resize handler redraws at the new cell width
        charts = page.evaluate(CHARTS_INSIDE_THEIR_CARDS)
        assert {"util", "held"} <= {c["key"] for c in charts}  # frag: from the minute rollup
        assert all(c["inside"] for c in charts), (width, charts)
    table = page.locator("[data-models]")
    assert "H100-80GB-SXM" in table.inner_text()
