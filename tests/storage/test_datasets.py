"""Datasets: the resumable upload, the import from a URL (a server on loopback), the checksum,
the limits, and the path rules (no user path, no symlink followed)."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from portal.errors import DomainError
from storage import datasets
from storage.models import GIB, FillState, Volume
from storage.paths import container_path_validate, safe_file_name
from tests.polling import wait_for

pytestmark = pytest.mark.django_db

BASE = "/api/v1/projects/alpha/volumes"


def _dataset(api, team, name="ds", size_gib=1):
    made = api(team["member"]).post(
        BASE,
        {"name": name, "kind": "shared", "size_gib": size_gib, "is_dataset": True},
        format="json",
    )
    assert made.status_code == 201, made.content
    return made.json()


def _chunk(client, url, offset, data):
    return client.patch(
        url, data, content_type="application/octet-stream", HTTP_UPLOAD_OFFSET=str(offset)
    )


def test_an_upload_in_chunks_resumes_where_it_stopped_and_seals_with_its_checksum(
    team, api, shared_root
):
    made = _dataset(api, team)
    member = api(team["member"])
    url = f"{BASE}/ds/upload"
    payload = bytes(range(256)) * 40  # 10240 bytes
    started = member.post(
        url, {"file_name": "corpus.tar", "size_bytes": len(payload)}, format="json"
    )
    assert started.status_code == 200 and started.json()["offset"] == 0
    assert _chunk(member, url, 0, payload[:4096]).json()["offset"] == 4096
    # The connection broke; the client asks where it stands, and a chunk at another offset is
    # refused with the offset to continue from.
    wrong = _chunk(member, url, 0, payload[:4096])
    assert wrong.status_code == 409 and "continues at offset 4096" in wrong.json()["message"]
    again = member.post(url, {"file_name": "corpus.tar", "size_bytes": len(payload)}, format="json")
    assert again.json()["offset"] == 4096  # the same file again: resumed, not restarted
    assert member.get(url).json()["percent"] == 40
    done = _chunk(member, url, 4096, payload[4096:])
    assert done.status_code == 200
    expected = hashlib.sha256(payload).hexdigest()
    assert done.json()["state"] == "ready" and done.json()["sha256"] == expected
    stored = shared_root / f"v{made['id']}" / "corpus.tar"
    assert stored.read_bytes() == payload
    sealed = member.post(url, {"file_name": "other", "size_bytes": 1}, format="json")
    assert sealed.status_code == 409 and sealed.json()["code"] == "dataset_sealed"
    assert member.get(f"{BASE}/ds").json()["mounted_read_only"] is True


def test_uploads_over_the_limit_and_past_the_announced_size_are_refused(team, api):
    _dataset(api, team, size_gib=1)
    member = api(team["member"])
    url = f"{BASE}/ds/upload"
    over = member.post(url, {"file_name": "big", "size_bytes": GIB + 1}, format="json")
    assert over.status_code == 400 and "size_bytes" in over.json()["fields"]
    assert "limit is 1 GiB" in over.json()["message"]
    member.post(url, {"file_name": "small", "size_bytes": 4}, format="json")
    past = _chunk(member, url, 0, b"12345")
    assert past.status_code == 400 and "past the file's announced size 4" in past.json()["message"]
    assert (
        api(team["viewer"])
        .post(url, {"file_name": "x", "size_bytes": 1}, format="json")
        .status_code
        == 403
    )
    no_offset = member.patch(url, b"1", content_type="application/octet-stream")
    assert no_offset.status_code == 400 and "Upload-Offset" in no_offset.json()["fields"]


def test_a_volume_that_is_not_a_dataset_takes_no_upload(team, api):
    api(team["member"]).post(BASE, {"name": "plain", "size_gib": 1}, format="json")
    answer = api(team["member"]).post(
        f"{BASE}/plain/upload", {"file_name": "x", "size_bytes": 1}, format="json"
    )
    assert answer.status_code == 400 and "not a dataset" in answer.json()["message"]


def test_file_names_are_sanitised_and_a_planted_symlink_is_not_followed(team, api, shared_root):
    made = _dataset(api, team)
    member = api(team["member"])
    url = f"{BASE}/ds/upload"
    answer = member.post(url, {"file_name": "../../etc/passwd", "size_bytes": 3}, format="json")
    assert answer.json()["file_name"] == "passwd"
    assert (shared_root / f"v{made['id']}" / "passwd").exists()
    # A job with the volume mounted read-write swaps the file for a link to a host file.
    victim = shared_root.parent / "victim"
    victim.write_text("host file")
    target = shared_root / f"v{made['id']}" / "passwd"
    target.unlink()
    target.symlink_to(victim)
    refused = _chunk(member, url, 0, b"abc")
    assert refused.status_code == 409 and refused.json()["code"] == "unsafe_path"
    assert victim.read_text() == "host file"


def test_path_rules():
    assert safe_file_name("a b/../c d.tar.gz") == "c_d.tar.gz"
    assert safe_file_name("..") == "data" and safe_file_name(".hidden") == "hidden"
    assert safe_file_name("C:\\x\\y.bin") == "y.bin"
    assert container_path_validate("/data/x/", field="path") == "/data/x"
    for bad in ("data", "/data/../etc", "/proc/1", "/", "/etc/passwd", "/dev"):
        with pytest.raises(DomainError) as exc:
            container_path_validate(bad, field="path")
        assert exc.value.field == "path"


class _Source(BaseHTTPRequestHandler):
    body = b""
    redirect_to = ""
    announce = True  # send Content-Length (else the body ends when the connection closes)

    def do_GET(self) -> None:
        if self.path.startswith("/redirect") and self.redirect_to:
            self.send_response(302)
            self.send_header("Location", self.redirect_to)
            self.end_headers()
            return
        if self.path.startswith("/missing"):
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        if self.announce:
            self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def source() -> Iterator[tuple[str, type[_Source]]]:
    handler = type("Handler", (_Source,), {"body": b"", "redirect_to": ""})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


def test_an_import_from_a_url_lands_under_the_volume_with_its_checksum(
    team, api, source, shared_root, django_capture_on_commit_callbacks
):
    base, handler = source
    handler.body = b"tokens " * 1000
    with django_capture_on_commit_callbacks() as callbacks:
        made = api(team["member"]).post(
            BASE,
            {
                "name": "web",
                "kind": "shared",
                "size_gib": 1,
                "is_dataset": True,
                "source_url": f"{base}/files/../shards.bin?x=1",
            },
            format="json",
        )
    assert made.status_code == 201 and made.json()["fill_state"] == "importing"
    assert len(callbacks) == 1  # the import task is queued after the commit
    datasets.dataset_import_run(volume_id=made.json()["id"])  # what the task runs
    volume = Volume.objects.get()
    assert volume.fill_state == FillState.READY
    assert volume.sha256 == hashlib.sha256(handler.body).hexdigest()
    assert volume.size_bytes == len(handler.body) and volume.file_name == "shards.bin"
    assert (shared_root / f"v{volume.pk}" / "shards.bin").read_bytes() == handler.body
    assert [p.name for p in (shared_root / f"v{volume.pk}").iterdir()] == ["shards.bin"]
    datasets.dataset_import_run(volume_id=volume.pk)  # a redelivered task changes nothing
    assert Volume.objects.get().sha256 == volume.sha256


def test_imports_refuse_other_schemes_and_private_addresses(team, api, settings, source):
    base, _handler = source
    member = api(team["member"])
    body = {"name": "x", "kind": "shared", "size_gib": 1, "is_dataset": True}
    for url in ("file:///etc/passwd", "ftp://example.org/x", "http://user:pw@example.org/x"):
        answer = member.post(BASE, {**body, "source_url": url}, format="json")
        assert answer.status_code == 400 and "source_url" in answer.json()["fields"], url
    settings.STORAGE_IMPORT_ALLOW_PRIVATE_HOSTS = False
    for url in (f"{base}/x", "http://10.0.0.1/x", "http://[::1]/x"):
        answer = member.post(BASE, {**body, "source_url": url}, format="json")
        assert answer.status_code == 400, url
        assert "not a private or local one" in answer.json()["message"]
    assert not Volume.objects.exists()


def test_an_import_that_fails_says_why(team, api, settings, source):
    base, handler = source
    handler.body = b"x" * 100
    member = api(team["member"])
    body = {"kind": "shared", "size_gib": 1, "is_dataset": True}
    missing = member.post(
        BASE, {**body, "name": "m", "source_url": f"{base}/missing"}, format="json"
    )
    datasets.dataset_import_run(volume_id=missing.json()["id"])
    assert Volume.objects.get(name="m").fill_error == "The source answered HTTP 404."
    # A redirect to a private address is checked like the first URL.
    handler.redirect_to = "http://10.0.0.1/secret"
    hop = member.post(BASE, {**body, "name": "r", "source_url": f"{base}/redirect"}, format="json")
    settings.STORAGE_IMPORT_ALLOW_PRIVATE_HOSTS = False
    datasets.dataset_import_run(volume_id=hop.json()["id"])
    failed = Volume.objects.get(name="r")
    assert failed.fill_state == FillState.FAILED and "private" in failed.fill_error


@pytest.mark.parametrize("announce", [True, False], ids=["announced", "streamed"])
def test_an_import_larger_than_the_limit_is_refused(
    team, api, source, shared_root, monkeypatch, announce
):
    base, handler = source
    handler.body = b"y" * 5000
    handler.announce = announce
    monkeypatch.setattr(Volume, "limit_bytes", property(lambda self: 4096))
    made = _dataset(api, team, name="big")
    Volume.objects.filter(pk=made["id"]).update(
        source_url=f"{base}/big.bin", fill_state=FillState.IMPORTING
    )
    datasets.dataset_import_run(volume_id=made["id"])
    volume = Volume.objects.get()
    assert volume.fill_state == FillState.FAILED and "limit" in volume.fill_error
    folder = shared_root / f"v{volume.pk}"
    assert not folder.exists() or list(folder.iterdir()) == []  # no partial file left


def test_the_dataset_page_shows_progress_and_stops_polling_when_ready(team, api, client):
    made = _dataset(api, team)
    client.force_login(team["viewer"])
    page = client.get(f"/projects/alpha/storage/{made['id']}/")
    assert page.status_code == 200 and b"dataset-progress" in page.content
    assert b"dataset-upload" not in page.content  # viewers do not upload
    Volume.objects.filter(pk=made["id"]).update(
        fill_state=FillState.UPLOADING, size_bytes=200, upload_offset=50
    )
    polled = client.get(f"/projects/alpha/storage/{made['id']}/", HTTP_HX_REQUEST="true")
    assert polled.status_code == 200 and b"(25%)" in polled.content
    Volume.objects.filter(pk=made["id"]).update(fill_state=FillState.READY, sha256="ab" * 32)
    done = client.get(f"/projects/alpha/storage/{made['id']}/", HTTP_HX_REQUEST="true")
    assert done.status_code == 286 and b"abab" in done.content
    client.force_login(team["outsider"])
    assert client.get(f"/projects/alpha/storage/{made['id']}/").status_code == 404


@pytest.mark.celery
@pytest.mark.django_db(transaction=True)
def test_the_import_and_the_purge_run_on_a_real_worker(
    team, api, source, shared_root, celery_live_worker
):
    """The tasks by their names, after the commit, on the broker: the import fills the dataset
    and deleting a shared volume removes its files."""
    base, handler = source
    handler.body = b"rows\n" * 2000
    member = api(team["member"])
    made = member.post(
        BASE,
        {
            "name": "remote",
            "kind": "shared",
            "size_gib": 1,
            "is_dataset": True,
            "source_url": f"{base}/rows.txt",
        },
        format="json",
    ).json()
    wait_for(lambda: Volume.objects.get(pk=made["id"]).fill_state == FillState.READY, timeout=30)
    assert Volume.objects.get(pk=made["id"]).sha256 == hashlib.sha256(handler.body).hexdigest()
    folder = shared_root / f"v{made['id']}"
    assert (folder / "rows.txt").read_bytes() == handler.body
    assert member.delete(f"{BASE}/remote").status_code == 204
    wait_for(lambda: Volume.objects.get(pk=made["id"]).state == "deleted", timeout=30)
    assert not folder.exists()
