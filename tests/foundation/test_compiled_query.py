"""`CompiledQuery`: compiled once, then each call's parameters and only its rows."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, NamedTuple

import pytest
from django.db.models import F
from django.utils import timezone

from foundation.db import AnyOf, CompiledQuery, EpochSeconds
from portal.models import Project
from scheduler.models import Node


class SlugRow(NamedTuple):
    slug: str


class NodeRow(NamedTuple):
    name: str
    labels: dict[str, Any]
    created_s: float


def counted(build):
    """`build`, counting how often the queryset is built."""
    calls = []

    def wrapper(**params):
        calls.append(params)
        return build(**params)

    return wrapper, calls


@pytest.mark.django_db
def test_compiled_once_then_each_call_gets_its_own_parameters(make_project):
    for slug in ("a", "b", "c"):
        make_project(slug)
    build, calls = counted(
        lambda slugs, since: (
            Project.objects.filter(AnyOf(F("slug"), slugs), created_at__gte=since)
            .order_by("slug")
            .values_list("slug")
        )
    )
    query = CompiledQuery(build, row=SlugRow)
    past = timezone.now() - timedelta(hours=1)
    assert query.rows(slugs=["a"], since=past) == [("a",)]
    assert query.rows(slugs=["b", "c", "zz"], since=past) == [("b",), ("c",)]
    assert query.rows(slugs=[], since=past) == []
    assert query.rows(slugs=["a", "b"], since=timezone.now() + timedelta(hours=1)) == []
    assert len(calls) == 1  # built and compiled by the first call only


@pytest.mark.django_db
def test_rows_are_converted_as_django_would(fleet):
    query = CompiledQuery(
        lambda: Node.objects.order_by("pk").values_list(
            "name", "labels", EpochSeconds("created_at")
        ),
        row=NodeRow,
    )
    expected = list(
        Node.objects.order_by("pk").values_list("name", "labels", EpochSeconds("created_at"))
    )
    rows = query.rows()
    assert rows == expected
    assert isinstance(rows[0].labels, dict) and isinstance(rows[0].created_s, float)


@pytest.mark.django_db
def test_a_row_type_that_names_other_columns_than_the_query_is_refused(make_project):
    make_project("a")
    query = CompiledQuery(lambda: Project.objects.values_list("slug", "name"), row=SlugRow)
    with pytest.raises(TypeError):
        query.rows()
