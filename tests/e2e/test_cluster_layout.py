"""The operator's cluster overview in a real browser: live, and every chart inside its card
at a wide and a narrow window (uPlot draws at a fixed width, so a wrong one spills over)."""

from __future__ import annotations

import re

import pytest
from django.core.management import call_command

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

CHARTS_INSIDE_THEIR_CARDS = """() => [...document.querySelectorAll('.mon-chart')].map(chart => {
  const card = chart.closest('.card').getBoundingClientRect();
  const drawn = chart.querySelector('.uplot').getBoundingClientRect();
  return {key: chart.dataset.chartKey, inside: drawn.left >= card.left && drawn.right <= card.right};
})"""


def test_cluster_overview_is_live_and_its_charts_fit(page):
    call_command("seed_demo", verbosity=0)
    page.set_viewport_size({"width": 1300, "height": 900})
    page.goto("/login/")
    page.fill("#id_username", "operator@gpucloud.example")
    page.fill("#id_password", "operator-demo-pass")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r".*/$"))
    page.goto("/monitoring/")
    page.wait_for_function("() => document.querySelectorAll('.mon-chart .uplot').length === 3")
    # the page head says when the overview was last refreshed
    page.wait_for_function("() => /\\d/.test(document.querySelector('[data-updated]').textContent)")
    for width in (1300, 820):
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(300)  # the resize handler redraws at the new cell width
        charts = page.evaluate(CHARTS_INSIDE_THEIR_CARDS)
        assert [c["key"] for c in charts] == ["util", "held", "frag"]
        assert all(c["inside"] for c in charts), (width, charts)
    table = page.locator("[data-models]")
    assert "H100-80GB-SXM" in table.inner_text()
