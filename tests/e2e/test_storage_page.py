"""A member uses the project's Storage page in a real browser: creates a volume and a dataset,
uploads a file with progress and sees its checksum, and is told the numbers when a volume
does not fit the project's storage quota."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest

from portal.models import Membership, Role
from portal.services import project_create

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# Every text the upload's status line shows, kept in sessionStorage: the page reloads itself
# once the upload is complete, and the record has to outlive that.
RECORD_STATUS = """
document.addEventListener("DOMContentLoaded", () => {
  const status = document.querySelector("#dataset-upload [data-role=status]");
  if (!status) return;
  new MutationObserver(() => {
    const seen = JSON.parse(sessionStorage.getItem("seen") || "[]");
    const bar = document.querySelector("#dataset-upload progress");
    seen.push({text: status.textContent, bar: bar && !bar.hidden ? bar.value : null});
    sessionStorage.setItem("seen", JSON.stringify(seen));
  }).observe(status, {childList: true, characterData: true, subtree: true});
});
"""


@pytest.fixture
def storage_root(tmp_path, settings):
    settings.STORAGE_SHARED_ROOT = str(tmp_path / "shared")
    settings.STORAGE_DEFAULT_QUOTA_GIB = 100
    return tmp_path


def test_member_creates_volumes_uploads_a_dataset_and_hits_the_quota(page, storage_root, make_user):
    owner, member = make_user(), make_user("member@example.org")
    project = project_create(owner=owner, slug="alpha", name="Alpha")
    Membership.objects.create(project=project, user=member, role=Role.MEMBER)
    page.add_init_script(RECORD_STATUS)

    page.goto("/login/")
    page.fill("#id_username", "member@example.org")
    page.fill("#id_password", "pw-123456")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r".*/$"))

    page.goto("/projects/alpha/storage/")
    assert "No volumes yet" in page.get_by_test_id("volumes").inner_text()
    assert "0 / 100 GiB" in page.get_by_test_id("storage-quota").inner_text()

    new = page.get_by_test_id("volume-new")
    new.get_by_label("Name").fill("work")
    new.get_by_label("Kind").select_option("shared")
    new.get_by_label("Size limit (GiB)").fill("20")
    new.get_by_role("button", name="Create").click()
    row = page.get_by_test_id("volume-work")
    row.wait_for()
    assert "20 GiB" in row.inner_text() and "Shared" in row.inner_text()
    assert "…" not in row.inner_text()
    assert "20 / 100 GiB" in page.get_by_test_id("storage-quota").inner_text()

    new = page.get_by_test_id("volume-new")
    new.get_by_label("Name").fill("corpus")
    new.get_by_label("Size limit (GiB)").fill("5")
    new.get_by_role("checkbox", name=re.compile("Dataset")).check()
    new.get_by_role("button", name="Create").click()
    row = page.get_by_test_id("volume-corpus")
    row.wait_for()
    assert "dataset (read-only)" in row.inner_text() and "5 GiB" in row.inner_text()
    assert "25 / 100 GiB" in page.get_by_test_id("storage-quota").inner_text()

    # The upload, from the dataset's page.
    row.get_by_role("link", name="corpus").click()
    page.wait_for_url("**/projects/alpha/storage/*/")
    content = b"step,loss\n" + b"".join(f"{i},{1 / (i + 1):.6f}\n".encode() for i in range(200))
    page.get_by_label("File").set_input_files(
        {"name": "losses.csv", "mimeType": "text/csv", "buffer": content}
    )
    page.get_by_role("button", name="Upload").click()
    sha = page.get_by_test_id("sha256")
    page.wait_for_function(
        "hex => document.querySelector('[data-testid=sha256]')?.innerText.includes(hex)",
        arg=hashlib.sha256(content).hexdigest(),
    )
    seen = json.loads(page.evaluate("sessionStorage.getItem('seen')") or "[]")
    # The bar and the bytes sent were shown while it went, the bar full at the end.
    assert any(re.fullmatch(rf"\d+% \(\d+ of {len(content)} bytes\)", s["text"]) for s in seen)
    assert seen and all(s["bar"] is not None for s in seen) and seen[-1]["bar"] == 100
    assert sha.inner_text() == hashlib.sha256(content).hexdigest()
    progress = page.get_by_test_id("dataset-progress").inner_text()
    assert "Ready" in progress and "losses.csv" in progress and "(100%)" in progress

    # Over the quota: the form again, filled in, with the numbers.
    page.goto("/projects/alpha/storage/")
    new = page.get_by_test_id("volume-new")
    new.get_by_label("Name").fill("huge")
    new.get_by_label("Size limit (GiB)").fill("200")
    new.get_by_role("button", name="Create").click()
    error = new.get_by_test_id("error-size_gib")
    error.wait_for()
    said = error.inner_text()
    assert "storage quota is 100 GiB" in said and "its volumes take 25 GiB" in said
    assert "200 GiB more does not fit (75 GiB left)" in said
    assert new.get_by_label("Name").input_value() == "huge"
    assert page.get_by_test_id("volume-huge").count() == 0

    shots = Path(os.environ.get("E2E_SCREENSHOT_DIR") or storage_root)
    shots.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(shots / "storage-page.png"), full_page=True)
