"""Storage settings (owned by the storage app); imported at the end of base settings.

`STORAGE_BEAT_SCHEDULE` is merged into CELERY_BEAT_SCHEDULE by base settings.
"""

from pathlib import Path

import environ

_env = environ.Env()
_BASE_DIR = Path(__file__).resolve().parent.parent.parent

# Where the portal sees the shared filesystem (the NFS/Lustre/CephFS export operators mount on
# every node of a pool at the agents' `shared_root`); the portal writes dataset uploads and
# imports there, under v<volume id>/. The demo and the tests use a local directory.
STORAGE_SHARED_ROOT = _env("STORAGE_SHARED_ROOT", default=str(_BASE_DIR / "var" / "shared-storage"))
# A project's storage quota (GiB, the sum of its volumes' size limits) until operators set one.
STORAGE_DEFAULT_QUOTA_GIB = _env.int("STORAGE_DEFAULT_QUOTA_GIB", default=1000)
# Dataset imports: refuse private and local addresses unless allowed (the tests' loopback
# server), as webhooks do; the time one read from the source may take.
STORAGE_IMPORT_ALLOW_PRIVATE_HOSTS = _env.bool("STORAGE_IMPORT_ALLOW_PRIVATE_HOSTS", default=False)
STORAGE_IMPORT_TIMEOUT_SECONDS = _env.float("STORAGE_IMPORT_TIMEOUT_SECONDS", default=30.0)
# The largest chunk of an upload one request may carry (the browser and the CLI send 8 MiB).
STORAGE_UPLOAD_MAX_CHUNK_BYTES = _env.int("STORAGE_UPLOAD_MAX_CHUNK_BYTES", default=32 * 2**20)
STORAGE_METER_SECONDS = _env.float("STORAGE_METER_SECONDS", default=3600.0)

STORAGE_BEAT_SCHEDULE = {
    "billing-storage-meter": {  # volume GB-months → the ledger (billing/services/storage_metering.py)
        "task": "billing.storage_meter",
        "schedule": STORAGE_METER_SECONDS,
        "options": {"expires": STORAGE_METER_SECONDS},
    },
}
# The storage price per GB-month metering seeds when the price list has none (billing 0010
# starts it at 0.10); operators publish others in the admin (billing.StoragePrice).
STORAGE_PRICE_PER_GB_MONTH = _env("STORAGE_PRICE_PER_GB_MONTH", default="0.10")
