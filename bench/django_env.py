"""Run a benchmark against a real, dedicated PostgreSQL database (created and migrated here).

Uses DATABASE_URL's server with the database name `<name>_bench`; never the development one.
"""

from __future__ import annotations

import os
from urllib.parse import urlparse, urlunparse


def setup(db_suffix: str = "bench") -> str:
    """Point Django at a fresh bench database, migrate it, and return its URL."""
    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpuportal")
    parts = urlparse(base)
    name = f"{parts.path.lstrip('/') or 'gpuportal'}_{db_suffix}"
    os.environ["DATABASE_URL"] = urlunparse(parts._replace(path=f"/{name}"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")
    import psycopg

    admin = urlunparse(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    return os.environ["DATABASE_URL"]


def reuse(db_suffix: str) -> bool:
    """Point Django at the database an earlier `setup(db_suffix)` made and set it up; False
    (nothing changed) when there is no such database."""
    import psycopg

    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpuportal")
    parts = urlparse(base)
    url = urlunparse(parts._replace(path=f"/{parts.path.lstrip('/') or 'gpuportal'}_{db_suffix}"))
    try:
        psycopg.connect(url).close()
    except psycopg.OperationalError:
        return False
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")
    import django

    django.setup()
    return True


def teardown() -> None:
    from django.db import connections

    connections.close_all()


def reset() -> str:
    """Drop, recreate and migrate the database `setup` chose, for another run in the same
    process (Django stays configured for it); returns its URL."""
    import psycopg
    from django.core.management import call_command
    from django.db import connections

    connections.close_all()
    url = os.environ["DATABASE_URL"]
    parts = urlparse(url)
    name = parts.path.lstrip("/")
    with psycopg.connect(urlunparse(parts._replace(path="/postgres")), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    call_command("migrate", verbosity=0)
    return url
