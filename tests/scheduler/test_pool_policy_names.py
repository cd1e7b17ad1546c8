"""A pool's queue policy and scorer are names the scheduler core knows: the admin offers only
those, and a name written around it is refused by the cycle with the names it knows."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from scheduler.core.plan import QUEUE_POLICIES
from scheduler.core.scorers import SCORER_NAMES
from scheduler.cycle import run_cycle
from scheduler.models import QUEUE_POLICY_LABELS, SCORER_LABELS, Pool


def test_the_pool_choices_are_the_core_s_names():
    assert [c for c, _ in Pool._meta.get_field("scorer").choices] == list(SCORER_NAMES)
    assert [c for c, _ in Pool._meta.get_field("queue_policy").choices] == list(QUEUE_POLICIES)
    assert set(SCORER_LABELS) == set(SCORER_NAMES)  # every name has its words, and no others
    assert set(QUEUE_POLICY_LABELS) == set(QUEUE_POLICIES)


@pytest.mark.django_db
def test_the_admin_refuses_an_unknown_scorer(client, fleet):
    client.force_login(_superuser())
    pool = fleet["pool"]
    url = f"/admin/scheduler/pool/{pool.pk}/change/"
    form = {
        "name": pool.name,
        "description": "",
        "queue_policy": "priority",
        "scorer": "fgd2",
        "backfill": "on",
        "preemption": "on",
        "backend": "agents",
        # the pool's Slurm section (an inline): none
        "slurm-TOTAL_FORMS": "0",
        "slurm-INITIAL_FORMS": "0",
        "slurm-MIN_NUM_FORMS": "0",
        "slurm-MAX_NUM_FORMS": "1",
    }
    resp = client.post(url, form)
    assert resp.status_code == 200 and "Select a valid choice" in resp.content.decode()
    pool.refresh_from_db()
    assert pool.scorer == "default"
    resp = client.post(url, {**form, "scorer": "fgd"})
    assert resp.status_code == 302
    pool.refresh_from_db()
    assert pool.scorer == "fgd"


def _superuser():
    from portal.models import User

    return User.objects.create_superuser("root@example.org", "pw-123456")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("field", "message"),
    [("scorer", "scorer 'fgd2' is unknown"), ("queue_policy", "queue policy 'fgd2' is unknown")],
)
def test_the_cycle_refuses_an_unknown_name_with_the_names_it_knows(
    team, fleet, api, field, message
):
    body = {"project": "alpha", "name": "x", "command": "true"}
    assert api(team["member"]).post("/api/v1/jobs", body, format="json").status_code == 201
    Pool.objects.update(**{field: "fgd2"})  # around the admin: a shell or SQL
    with pytest.raises(ImproperlyConfigured, match=message) as refused:
        run_cycle()
    assert "choose one of" in str(refused.value)
