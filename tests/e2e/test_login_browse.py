"""A researcher logs in in a real browser, opens the project page, sees quotas and the catalog."""

from __future__ import annotations

import re

import pytest
from django.core.management import call_command

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_researcher_sees_project_quotas_and_catalog(page):
    call_command("seed_demo", verbosity=0)
    page.goto("/")
    assert "/login/" in page.url
    page.fill("#id_username", "researcher@gpucloud.example")
    page.fill("#id_password", "researcher-demo-pass")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r".*/$"))
    assert page.locator("h1").inner_text().startswith("Welcome")

    page.click("main >> text=Vision Lab")
    page.wait_for_url("**/projects/vision-lab/")
    quotas = page.get_by_test_id("quotas")
    assert "Concurrent GPUs" in quotas.inner_text()
    assert "0 / 16 GPUs" in quotas.inner_text()
    assert "H100-80GB-SXM GPUs" in quotas.inner_text()
    assert page.get_by_test_id("my-role").inner_text() == "owner"
    assert "colleague@gpucloud.example" in page.get_by_test_id("members").inner_text()

    # From the project to its usage and cost, and back.
    page.get_by_test_id("project-links").get_by_text("Usage and cost").click()
    page.wait_for_url("**/billing/projects/vision-lab/usage/")
    assert "Vision Lab" in page.locator("main").inner_text()
    page.go_back()

    page.click("nav >> text=GPU catalog")
    page.wait_for_url("**/gpus/")
    table = page.get_by_test_id("catalog")
    assert "H200-141GB" in table.inner_text()
    # htmx swaps the table in place when a filter changes
    page.select_option("select[name=precision]", "fp8")
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=catalog]').innerText.includes('A100-80GB')"
    )
    text = page.get_by_test_id("catalog").inner_text()
    assert "H100-80GB-SXM" in text and "L4" in text and "T4" not in text
