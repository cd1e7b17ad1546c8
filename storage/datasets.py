"""Filling a dataset: a resumable upload or an import from an HTTP(S) URL.

A dataset holds one file (a tarball, a Parquet file...) and is sealed once it is complete: its
SHA-256 is recorded and shown, and jobs mount it read-only. The file lands at
<STORAGE_SHARED_ROOT>/v<id>/<sanitised name>, written through `storage.paths` (directory
descriptors, O_NOFOLLOW), never at a path the user gave.

Upload: `dataset_upload_start` (name and total size; the same name and size again resumes),
then `dataset_upload_chunk` at the offset the server reports (a chunk at any other offset is
refused with the offset to continue from, so a broken upload continues where it stopped), and
the last chunk seals the dataset. Import: `import_url_check` at creation (http/https only, and
no private or local address unless STORAGE_IMPORT_ALLOW_PRIVATE_HOSTS), then the Celery task
`storage.dataset_import` streams it (`dataset_import_run`), checking every redirect again.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import os
import socket
from urllib.parse import urljoin, urlsplit

import requests
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from portal.audit import audit_record
from portal.errors import Conflict, DomainError
from portal.models import Role, User
from portal.services import require_role
from storage.models import FillState, Volume
from storage.paths import open_file, safe_file_name, volume_dir_fd

READ_BLOCK = 1024 * 1024
MAX_REDIRECTS = 5


def _require_dataset(volume: Volume) -> None:
    if not volume.is_dataset:
        raise DomainError(f"Volume {volume.name} is not a dataset; jobs fill it.", field="name")


def _sealed(volume: Volume) -> None:
    if volume.fill_state == FillState.READY:
        raise Conflict(
            f"Dataset {volume.name} is complete (sha256 {volume.sha256}) and read-only; create "
            "another dataset for new data.",
            code="dataset_sealed",
        )
    if volume.fill_state == FillState.IMPORTING:
        raise Conflict(f"Dataset {volume.name} is being imported.", code="dataset_importing")


def _locked(volume: Volume) -> Volume:
    fresh = Volume.objects.select_for_update().get(pk=volume.pk)
    fresh.project = volume.project
    return fresh


@transaction.atomic
def dataset_upload_start(*, actor: User, volume: Volume, file_name: str, size_bytes: int) -> Volume:
    """Begin (or resume) uploading one file of `size_bytes`. The same name and size while an
    upload is under way resumes at the offset received; anything else starts over."""
    require_role(user=actor, project=volume.project, roles=(Role.OWNER, Role.MEMBER))
    _require_dataset(volume)
    volume = _locked(volume)
    _sealed(volume)
    name = safe_file_name(file_name)
    if size_bytes < 1:
        raise DomainError("An upload has at least one byte.", field="size_bytes")
    if size_bytes > volume.limit_bytes:
        raise DomainError(
            f"The file is {size_bytes} bytes; dataset {volume.name}'s limit is "
            f"{volume.size_gib} GiB ({volume.limit_bytes} bytes).",
            field="size_bytes",
        )
    resuming = (
        volume.fill_state == FillState.UPLOADING
        and volume.file_name == name
        and volume.size_bytes == size_bytes
    )
    if resuming:
        return volume
    with volume_dir_fd(volume.pk, create=True) as dir_fd:
        if volume.file_name and volume.file_name != name:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(volume.file_name, dir_fd=dir_fd)
        fd = open_file(dir_fd, name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.close(fd)
    volume.file_name, volume.size_bytes, volume.upload_offset = name, size_bytes, 0
    volume.fill_state, volume.fill_error, volume.sha256 = FillState.UPLOADING, "", ""
    volume.save(
        update_fields=[
            "file_name",
            "size_bytes",
            "upload_offset",
            "fill_state",
            "fill_error",
            "sha256",
        ]
    )
    audit_record(
        actor=actor,
        action="storage.dataset.upload_start",
        target=volume,
        project=volume.project,
        data={"name": volume.name, "file": name, "size_bytes": size_bytes},
    )
    return volume


def _sha256_of(dir_fd: int, name: str) -> str:
    digest = hashlib.sha256()
    fd = open_file(dir_fd, name, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        for block in iter(lambda: f.read(READ_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


@transaction.atomic
def dataset_upload_chunk(
    *, actor: User, volume: Volume, offset: int | None, data: bytes | None
) -> Volume:
    """Write `data` at `offset`, which must be the offset received so far (a 409 says which
    it is otherwise). The chunk that completes the file seals the dataset with its SHA-256.
    (None: the request gave no offset, or no raw bytes.)"""
    require_role(user=actor, project=volume.project, roles=(Role.OWNER, Role.MEMBER))
    _require_dataset(volume)
    if offset is None:
        raise DomainError(
            "Send the chunk's start in the Upload-Offset header (a number).", field="Upload-Offset"
        )
    if data is None:
        raise DomainError("Send the chunk as application/octet-stream.", field="Content-Type")
    volume = _locked(volume)
    _sealed(volume)
    if volume.fill_state != FillState.UPLOADING:
        raise Conflict(
            f"No upload is under way for dataset {volume.name}: start one first.",
            code="no_upload",
        )
    if offset != volume.upload_offset:
        raise Conflict(
            f"The upload of {volume.name} continues at offset {volume.upload_offset}, not "
            f"{offset}.",
            code="offset_mismatch",
        )
    if not data:
        raise DomainError("An empty chunk.", field="data")
    if len(data) > settings.STORAGE_UPLOAD_MAX_CHUNK_BYTES:
        raise DomainError(
            f"A chunk is at most {settings.STORAGE_UPLOAD_MAX_CHUNK_BYTES} bytes.", field="data"
        )
    if offset + len(data) > volume.size_bytes:
        raise DomainError(
            f"The chunk ends at byte {offset + len(data)}, past the file's announced size "
            f"{volume.size_bytes}.",
            field="data",
        )
    with volume_dir_fd(volume.pk, create=False) as dir_fd:
        fd = open_file(dir_fd, volume.file_name, os.O_WRONLY)
        try:
            os.ftruncate(fd, offset)  # what a broken earlier chunk left past the offset goes
            os.pwrite(fd, data, offset)
            os.fsync(fd)
        finally:
            os.close(fd)
        volume.upload_offset = offset + len(data)
        fields = ["upload_offset", "used_bytes"]
        volume.used_bytes = volume.upload_offset
        if volume.upload_offset == volume.size_bytes:
            volume.sha256 = _sha256_of(dir_fd, volume.file_name)
            volume.fill_state = FillState.READY
            fields += ["sha256", "fill_state"]
    volume.save(update_fields=fields)
    if volume.fill_state == FillState.READY:
        audit_record(
            actor=actor,
            action="storage.dataset.ready",
            target=volume,
            project=volume.project,
            data={"name": volume.name, "sha256": volume.sha256, "size_bytes": volume.size_bytes},
        )
    return volume


# ---- import from a URL ---------------------------------------------------------------------


def import_url_check(url: str, *, field: str = "source_url") -> None:
    """http(s) with a host; a public address unless STORAGE_IMPORT_ALLOW_PRIVATE_HOSTS."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DomainError("Import from an http:// or https:// URL with a host.", field=field)
    if parts.username or parts.password:
        raise DomainError("Give the URL without a user name or password.", field=field)
    if settings.STORAGE_IMPORT_ALLOW_PRIVATE_HOSTS:
        return
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        infos = socket.getaddrinfo(parts.hostname, port, proto=socket.IPPROTO_TCP)
    except (OSError, ValueError):
        raise DomainError(f"The host {parts.hostname} does not resolve.", field=field) from None
    for info in infos:
        if not ipaddress.ip_address(info[4][0]).is_global:
            raise DomainError(
                "Import from a public address, not a private or local one.", field=field
            )


def _fail(volume_id: int, message: str) -> None:
    Volume.objects.filter(pk=volume_id).update(
        fill_state=FillState.FAILED, fill_error=message[:500]
    )
    volume = Volume.objects.select_related("project").get(pk=volume_id)
    audit_record(
        actor=None,
        action="storage.dataset.import_failed",
        target=volume,
        project=volume.project,
        data={"name": volume.name, "error": message[:500]},
    )


def _open_source(url: str) -> requests.Response:
    """GET `url`, following at most MAX_REDIRECTS redirects, each checked as the first."""
    for _ in range(MAX_REDIRECTS + 1):
        import_url_check(url)
        response = requests.get(
            url,
            stream=True,
            allow_redirects=False,
            timeout=settings.STORAGE_IMPORT_TIMEOUT_SECONDS,
        )
        if response.is_redirect and response.headers.get("Location"):
            url = urljoin(url, response.headers["Location"])
            response.close()
            continue
        return response
    raise DomainError(f"More than {MAX_REDIRECTS} redirects.", field="source_url")


def dataset_import_run(*, volume_id: int) -> None:
    """Stream the dataset's source URL into its directory, refusing more than its limit, and
    seal it with its SHA-256 (idempotent: a dataset no longer importing is left alone)."""
    volume = Volume.objects.select_related("project").filter(pk=volume_id).first()
    if volume is None or volume.fill_state != FillState.IMPORTING:
        return
    name = safe_file_name(urlsplit(volume.source_url).path or "data")
    partial = safe_file_name(f"partial-{name}")
    digest, written = hashlib.sha256(), 0
    try:
        response = _open_source(volume.source_url)
        with response:
            if response.status_code != 200:
                raise DomainError(f"The source answered HTTP {response.status_code}.")
            announced = int(response.headers.get("Content-Length") or 0)
            if announced > volume.limit_bytes:
                raise DomainError(
                    f"The source is {announced} bytes; the dataset's limit is "
                    f"{volume.size_gib} GiB."
                )
            with volume_dir_fd(volume.pk, create=True) as dir_fd:
                fd = open_file(dir_fd, partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                with os.fdopen(fd, "wb") as out:
                    for block in response.iter_content(READ_BLOCK):
                        written += len(block)
                        if written > volume.limit_bytes:
                            raise DomainError(
                                f"The source is larger than the dataset's limit of "
                                f"{volume.size_gib} GiB."
                            )
                        digest.update(block)
                        out.write(block)
                        Volume.objects.filter(pk=volume.pk).update(upload_offset=written)
                os.rename(partial, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except DomainError as exc:
        _cleanup_partial(volume.pk, partial)
        _fail(volume.pk, exc.message)
        return
    except (requests.RequestException, OSError) as exc:
        _cleanup_partial(volume.pk, partial)
        _fail(volume.pk, f"The import failed: {type(exc).__name__}: {exc}")
        return
    with transaction.atomic():
        updated = Volume.objects.filter(pk=volume.pk, fill_state=FillState.IMPORTING).update(
            fill_state=FillState.READY,
            file_name=name,
            size_bytes=written,
            upload_offset=written,
            used_bytes=written,
            sha256=digest.hexdigest(),
            fill_error="",
        )
        if updated:
            audit_record(
                actor=None,
                action="storage.dataset.ready",
                target=volume,
                project=volume.project,
                data={"name": volume.name, "sha256": digest.hexdigest(), "size_bytes": written},
            )


def _cleanup_partial(volume_id: int, partial: str) -> None:
    try:
        with volume_dir_fd(volume_id, create=False) as dir_fd:
            os.unlink(partial, dir_fd=dir_fd)
    except (OSError, DomainError):
        pass


def dataset_progress(volume: Volume) -> dict[str, object]:
    """What the browser and the CLI show while a dataset fills."""
    return {
        "state": volume.fill_state,
        "offset": volume.upload_offset,
        "size_bytes": volume.size_bytes,
        "percent": volume.progress_percent,
        "sha256": volume.sha256,
        "file_name": volume.file_name,
        "error": volume.fill_error,
        "checked_at": timezone.now().isoformat(),
    }
