"""The embedded lane runs only under `config.settings.embedded_test` (see scripts/test.sh)."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import connection


@pytest.fixture(autouse=True)
def _embedded_default() -> None:
    """Fail, rather than pass, when run against servers: these tests exist for the fallbacks."""
    assert connection.vendor == "sqlite", "run the embedded lane with config.settings.embedded_test"
    assert not settings.REDIS_URL
    assert settings.CACHES["default"]["BACKEND"].endswith("FileBasedCache")
