from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def shared_root(tmp_path, settings):
    """Each test's shared filesystem: a fresh directory (in the demo, var/shared-storage)."""
    root = tmp_path / "shared"
    settings.STORAGE_SHARED_ROOT = str(root)
    settings.STORAGE_DEFAULT_QUOTA_GIB = 100
    return root
