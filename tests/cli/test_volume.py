"""`gpucloud volume create|ls|rm|upload` against the live test server."""

from __future__ import annotations

import hashlib

import pytest

from storage import datasets
from storage.models import FillState, Volume
from storage.ports import VOLUME_IN_USE
from tests.cli.test_gpucloud import cli, logged_in  # noqa: F401 - the fixtures

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def shared_root(tmp_path, settings):
    settings.STORAGE_SHARED_ROOT = str(tmp_path / "shared")
    settings.STORAGE_DEFAULT_QUOTA_GIB = 30
    return tmp_path / "shared"


def test_create_ls_rm(logged_in):  # noqa: F811
    out = logged_in.ok("volume", "create", "ckpt", "--size", "10", "--project", "alpha")
    assert out == "Volume ckpt created in alpha (10 GiB, shared).\n"
    logged_in.ok("volume", "create", "local", "--size", "5", "--kind", "node_local", "--node", "h1")
    listing = logged_in.ok("volume", "ls").splitlines()
    assert listing[0].split() == [
        "NAME",
        "KIND",
        "SIZE_GIB",
        "DATASET",
        "CONTENT",
        "NODE",
        "SHA256",
    ]
    assert listing[1].split()[:4] == ["ckpt", "shared", "10", "no"]
    assert listing[2].split()[:3] == ["local", "node_local", "5"] and "h1" in listing[2]
    assert [v["name"] for v in logged_in.json("volume", "ls")] == ["ckpt", "local"]  # type: ignore[union-attr]

    over = logged_in("volume", "create", "big", "--size", "20")
    assert over.returncode == 1
    assert "storage quota is 30 GiB and its volumes take 15 GiB" in over.stderr
    assert "(HTTP 400)" in over.stderr

    volume = Volume.objects.get(name="ckpt")
    with VOLUME_IN_USE.override(lambda *, volume_ids: {volume.pk: [7]}):
        busy = logged_in("volume", "rm", "ckpt")
    assert busy.returncode == 1 and "is mounted by active job 7" in busy.stderr
    assert logged_in.ok("volume", "rm", "ckpt") == "Volume ckpt deleted from alpha.\n"
    # Its files are removed by a task (no worker here): until then it is being deleted.
    again = logged_in("volume", "rm", "ckpt")
    assert (
        again.returncode == 1 and "Volume ckpt is already being deleted. (HTTP 409)" in again.stderr
    )
    missing = logged_in("volume", "rm", "nothing")
    assert missing.returncode == 1 and "has no volume named 'nothing'" in missing.stderr


def test_upload_resumes_where_it_stopped_and_shows_progress(logged_in, team, tmp_path, shared_root):  # noqa: F811
    logged_in.ok("volume", "create", "corpus", "--size", "1", "--dataset")
    payload = bytes(range(256)) * 1000
    path = tmp_path / "corpus.bin"
    path.write_bytes(payload)
    # An earlier upload broke after 100000 bytes.
    volume = Volume.objects.get(name="corpus")
    volume = datasets.dataset_upload_start(
        actor=team["member"], volume=volume, file_name="corpus.bin", size_bytes=len(payload)
    )
    datasets.dataset_upload_chunk(
        actor=team["member"], volume=volume, offset=0, data=payload[:100000]
    )

    result = logged_in("volume", "upload", "corpus", str(path), "--chunk-mib", "1")
    assert result.returncode == 0, result.stderr
    assert "Resuming at byte 100000 of 256000." in result.stderr
    assert "100%  256000/256000 bytes" in result.stderr
    digest = hashlib.sha256(payload).hexdigest()
    assert (
        result.stdout == f"Uploaded corpus.bin to dataset corpus: 256000 bytes, sha256 {digest}.\n"
    )
    volume.refresh_from_db()
    assert volume.fill_state == FillState.READY and volume.sha256 == digest
    assert (shared_root / f"v{volume.pk}" / "corpus.bin").read_bytes() == payload
    again = logged_in("volume", "upload", "corpus", str(path))
    assert again.returncode == 1 and "read-only" in again.stderr
    assert logged_in("volume", "upload", "corpus", str(tmp_path / "nope")).returncode == 2
