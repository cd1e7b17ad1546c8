"""Volumes: create, list, delete through the API and the pages; roles; the storage quota;
the scheduler's "in use" port; requests for more quota."""

from __future__ import annotations

import pytest
from django.core import mail

from portal.models import AuditEvent
from storage import services
from storage.models import StorageQuota, StorageQuotaRequest, Volume, VolumeState
from storage.ports import VOLUME_IN_USE

pytestmark = pytest.mark.django_db

BASE = "/api/v1/projects/alpha/volumes"


def test_members_create_and_everyone_in_the_project_reads(team, api):
    member = api(team["member"])
    made = member.post(BASE, {"name": "data", "kind": "shared", "size_gib": 20}, format="json")
    assert made.status_code == 201, made.content
    assert made.json()["kind"] == "shared" and made.json()["mounted_read_only"] is False
    volume = Volume.objects.get()
    assert (volume.project, volume.size_gib, volume.created_by) == (team["a"], 20, team["member"])
    assert AuditEvent.objects.filter(action="storage.volume.create", target_id=str(volume.pk))

    for who in ("viewer", "owner"):
        listed = api(team[who]).get(BASE).json()["results"]
        assert [v["name"] for v in listed] == ["data"]
    assert api(team["viewer"]).get(f"{BASE}/data").json()["size_gib"] == 20
    refused = api(team["viewer"]).post(BASE, {"name": "x", "size_gib": 1}, format="json")
    assert refused.status_code == 403
    assert api(team["outsider"]).get(BASE).status_code == 404
    assert api(team["outsider"]).delete(f"{BASE}/data").status_code == 404
    assert Volume.objects.count() == 1


def test_bad_input_names_the_field(team, api):
    member = api(team["member"])
    cases = [
        ({"name": "Bad Name", "size_gib": 1}, "name"),
        ({"name": "ok", "size_gib": 0}, "size_gib"),
        ({"name": "ok", "kind": "hostpath", "size_gib": 1}, "kind"),
        ({"name": "ok", "kind": "scratch", "size_gib": 1, "is_dataset": True}, "kind"),
        ({"name": "ok", "kind": "shared", "size_gib": 1, "node_name": "n1"}, "node_name"),
        ({"name": "ok", "kind": "shared", "size_gib": 1, "source_url": "http://x"}, "source_url"),
    ]
    for body, field in cases:
        answer = member.post(BASE, body, format="json")
        assert answer.status_code == 400, (body, answer.content)
        assert field in answer.json()["fields"], (body, answer.json())
    assert Volume.objects.count() == 0


def test_node_local_volume_names_its_node_or_gets_one_when_first_used(team, api):
    member = api(team["member"])
    pinned = member.post(
        BASE,
        {"name": "pinned", "kind": "node_local", "size_gib": 5, "node_name": "h1"},
        format="json",
    )
    assert pinned.json()["node_name"] == "h1"
    loose = member.post(BASE, {"name": "loose", "kind": "node_local", "size_gib": 5}, format="json")
    assert loose.json()["node_name"] == ""
    volume = services.volume_bind_node(volume_id=loose.json()["id"], node_name="h2")
    assert volume.node_name == "h2"
    # Bound once: a later placement does not move it.
    assert services.volume_bind_node(volume_id=volume.pk, node_name="h3").node_name == "h2"
    assert AuditEvent.objects.filter(action="storage.volume.bind_node").count() == 1


def test_names_are_unique_among_live_volumes_and_free_again_after_delete(team, api):
    member = api(team["member"])
    assert member.post(BASE, {"name": "v", "size_gib": 1}, format="json").status_code == 201
    again = member.post(BASE, {"name": "v", "size_gib": 1}, format="json")
    assert again.status_code == 409 and "already has a volume named 'v'" in again.json()["message"]
    assert member.delete(f"{BASE}/v").status_code == 204
    assert member.post(BASE, {"name": "v", "size_gib": 1}, format="json").status_code == 201
    assert Volume.objects.filter(name="v").count() == 2


def test_over_the_quota_is_refused_with_the_numbers(team, api, settings):
    settings.STORAGE_DEFAULT_QUOTA_GIB = 50
    member = api(team["member"])
    assert member.post(BASE, {"name": "a", "size_gib": 40}, format="json").status_code == 201
    over = member.post(BASE, {"name": "b", "size_gib": 20}, format="json")
    assert over.status_code == 400
    body = over.json()
    assert body["code"] == "storage_quota_exceeded" and "size_gib" in body["fields"]
    assert "quota is 50 GiB" in body["message"] and "take 40 GiB" in body["message"]
    assert "20 GiB more does not fit (10 GiB left)" in body["message"]
    assert member.post(BASE, {"name": "b", "size_gib": 10}, format="json").status_code == 201
    quota = member.get("/api/v1/projects/alpha/storage").json()
    assert quota == {
        "quota_gib": 50,
        "allocated_gib": 50,
        "free_gib": 0,
        "used_bytes": 0,
        "volumes": 2,
    }
    # Deleting gives the room back.
    assert member.delete(f"{BASE}/a").status_code == 204
    assert member.get("/api/v1/projects/alpha/storage").json()["free_gib"] == 40


def test_operators_set_the_quota_others_cannot(team, api, make_user):
    staff = make_user(staff=True)
    body = {"max_gib": 500}
    for who in ("owner", "member", "viewer"):
        assert (
            api(team[who]).put("/api/v1/projects/alpha/storage", body, format="json").status_code
            == 403
        )
    answer = api(staff).put("/api/v1/projects/alpha/storage", body, format="json")
    assert answer.status_code == 200 and answer.json()["quota_gib"] == 500
    assert StorageQuota.objects.get(project=team["a"]).max_gib == 500
    event = AuditEvent.objects.get(action="storage.quota.set")
    assert event.data == {"max_gib": {"from": 100, "to": 500}}


def test_a_volume_an_active_job_mounts_cannot_be_deleted(team, api):
    member = api(team["member"])
    made = member.post(BASE, {"name": "ckpt", "size_gib": 1}, format="json").json()
    with VOLUME_IN_USE.override(lambda *, volume_ids: {made["id"]: [12, 13]}):
        refused = member.delete(f"{BASE}/ckpt")
    assert refused.status_code == 409
    assert refused.json()["code"] == "volume_in_use"
    assert refused.json()["message"].startswith("Volume ckpt is mounted by active jobs 12, 13;")
    assert Volume.objects.get().state == VolumeState.ACTIVE
    assert member.delete(f"{BASE}/ckpt").status_code == 204  # the default: nothing in use


def test_deleting_a_shared_volume_removes_its_files(
    team, api, shared_root, django_capture_on_commit_callbacks
):
    member = api(team["member"])
    made = member.post(BASE, {"name": "s", "size_gib": 1}, format="json").json()
    folder = shared_root / f"v{made['id']}"
    (folder / "deep").mkdir(parents=True)
    (folder / "deep" / "file").write_text("x")
    outside = shared_root.parent / "outside"
    outside.write_text("keep me")
    (folder / "link").symlink_to(outside)  # a job's symlink: removed, never followed
    with django_capture_on_commit_callbacks() as callbacks:
        assert member.delete(f"{BASE}/s").status_code == 204
    assert len(callbacks) == 1  # the purge task, after the commit
    assert Volume.objects.get().state == VolumeState.DELETING
    services.volume_purge(volume_id=made["id"])
    assert not folder.exists() and outside.read_text() == "keep me"
    volume = Volume.objects.get()
    assert volume.state == VolumeState.DELETED and volume.deleted_at is not None
    services.volume_purge(volume_id=made["id"])  # idempotent
    assert member.get(BASE).json()["results"] == []


def test_owners_ask_for_more_and_operators_decide(
    team, api, make_user, django_capture_on_commit_callbacks
):
    staff = make_user(staff=True)
    url = "/api/v1/projects/alpha/storage/requests"
    body = {"max_gib": 300, "justification": "a bigger corpus"}
    assert api(team["member"]).post(url, body, format="json").status_code == 403
    mail.outbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        asked = api(team["owner"]).post(url, body, format="json")
    assert asked.status_code == 201 and asked.json()["status"] == "pending"
    assert any(staff.email in m.to for m in mail.outbox)
    request_id = asked.json()["id"]
    decide = f"/api/v1/storage/requests/{request_id}/decide"
    assert (
        api(team["owner"]).post(decide, {"decision": "approve"}, format="json").status_code == 403
    )
    no_reason = api(staff).post(decide, {"decision": "decline"}, format="json")
    assert no_reason.status_code == 400 and "reason" in no_reason.json()["fields"]
    approved = api(staff).post(decide, {"decision": "approve"}, format="json")
    assert approved.status_code == 200 and approved.json()["status"] == "approved"
    assert StorageQuota.objects.get(project=team["a"]).max_gib == 300
    assert api(staff).post(decide, {"decision": "approve"}, format="json").status_code == 409
    assert StorageQuotaRequest.objects.get().decided_by == staff
    assert AuditEvent.objects.filter(action="storage.quota.request.approve").exists()
    assert api(team["owner"]).get(url).json()["results"][0]["status"] == "approved"


def test_the_storage_page_lists_creates_and_deletes(team, client):
    client.force_login(team["member"])
    page = client.get("/projects/alpha/storage/")
    assert page.status_code == 200 and b"New volume" in page.content
    made = client.post(
        "/projects/alpha/storage/", {"name": "web", "kind": "shared", "size_gib": "3"}
    )
    assert made.status_code == 302
    volume = Volume.objects.get(name="web")
    partial = client.get("/projects/alpha/storage/", HTTP_HX_REQUEST="true")
    assert b'data-testid="volume-web"' in partial.content and b"<html" not in partial.content
    assert "HX-Request" in partial["Vary"]
    assert client.post(f"/projects/alpha/storage/{volume.pk}/delete/").status_code == 302
    assert Volume.objects.get().state == VolumeState.DELETING


def test_viewers_see_the_page_without_the_form_and_are_refused_writes(team, client):
    client.force_login(team["viewer"])
    page = client.get("/projects/alpha/storage/")
    assert page.status_code == 200 and b"New volume" not in page.content
    refused = client.post(
        "/projects/alpha/storage/", {"name": "v", "kind": "shared", "size_gib": "1"}, follow=True
    )
    assert b"this needs owner or member" in refused.content
    assert not Volume.objects.exists()


def test_operators_page_sets_quotas_and_decides_requests(team, client, make_user):
    staff = make_user(staff=True)
    asked = StorageQuotaRequest.objects.create(
        project=team["a"], requested_by=team["owner"], max_gib=250, justification="x"
    )
    client.force_login(team["owner"])
    assert client.get("/ops/storage/").status_code == 403
    client.force_login(staff)
    page = client.get("/ops/storage/")
    assert page.status_code == 200 and b"250 GiB" in page.content
    assert client.post("/ops/storage/beta/quota/", {"max_gib": "7"}).status_code == 302
    assert StorageQuota.objects.get(project=team["b"]).max_gib == 7
    client.post(f"/ops/storage/requests/{asked.pk}/decide/", {"decision": "approve"})
    assert StorageQuota.objects.get(project=team["a"]).max_gib == 250


def test_the_volume_list_costs_the_same_queries_for_more_volumes(team, api, client):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    member = api(team["member"])
    client.force_login(team["member"])
    client.get("/projects/alpha/storage/")  # the session's first save is not the page's cost

    def costs() -> tuple[int, int]:
        with CaptureQueriesContext(connection) as listed:
            assert member.get(BASE).status_code == 200
        with CaptureQueriesContext(connection) as page:
            assert client.get("/projects/alpha/storage/").status_code == 200
        return len(listed), len(page)

    for n in range(2):
        member.post(BASE, {"name": f"a{n}", "size_gib": 1}, format="json")
    few = costs()
    for n in range(5):
        member.post(BASE, {"name": f"b{n}", "size_gib": 1, "is_dataset": True}, format="json")
    assert costs() == few
