"""PostgreSQL parses and plans a statement a connection keeps running only once."""

from __future__ import annotations

import pytest
from django.db import connection

from portal.models import Project

pytestmark = pytest.mark.django_db


def test_a_statement_run_again_and_again_is_prepared_on_the_server(make_project):
    make_project("alpha")

    def prepared() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_prepared_statements")
            return int(cursor.fetchone()[0])

    before = prepared()
    for _ in range(6):  # psycopg prepares on the fifth run (prepare_threshold)
        assert Project.objects.filter(slug="alpha").count() == 1
    assert prepared() > before
