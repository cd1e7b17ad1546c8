"""Redis commands after commit: sent once the transaction commits, in one round trip when
queued one after another, never ahead of an on-commit hook registered before them, dropped
with a savepoint or a transaction that rolls back; a submit's push message and its cycle
request travel together."""

from __future__ import annotations

import uuid

import pytest
from django.db import transaction

from foundation import redis_after_commit
from foundation.redis_after_commit import after_commit, redis_cache

pytestmark = pytest.mark.django_db(transaction=True)  # real commits run the hooks


@pytest.fixture
def sends(monkeypatch):
    """The round trips made (each batch sent), counted around the real send."""
    sent: list[int] = []
    real = redis_after_commit._Batch.__call__

    def counted(batch):
        sent.append(sum(len(e.commands) for e in batch.entries))
        real(batch)

    monkeypatch.setattr(redis_after_commit._Batch, "__call__", counted)
    return sent


def _key() -> str:
    return f"rac-{uuid.uuid4().hex}"


def test_commands_wait_for_the_commit_and_share_one_round_trip(sends):
    cache = redis_cache()
    assert cache is not None
    client = cache._cache.get_client(None, write=True)
    a, b = _key(), _key()
    answers: list[object] = []
    with transaction.atomic():
        after_commit(cache, [("SET", a, "1", "EX", 60)], on_answers=answers.extend)
        after_commit(
            cache,
            [("SET", b, "2", "EX", 60, "NX"), ("SET", b, "3", "EX", 60, "NX")],
            on_answers=answers.extend,
        )
        assert client.get(a) is None and sends == []  # nothing before the commit
    assert client.get(a) == b"1" and client.get(b) == b"2"
    assert sends == [3]  # one round trip for both callers
    assert answers == [True, True, None]  # each caller read its own answers, in order
    after_commit(cache, [("DEL", a)])  # outside a transaction: at once
    assert client.get(a) is None and sends == [3, 1]


def test_commands_keep_their_place_among_other_on_commit_hooks(sends):
    """A hook registered between two commands (dropping a cached version that a push message
    must not overtake) runs between them: the second command starts a round trip after it."""
    cache = redis_cache()
    client = cache._cache.get_client(None, write=True)
    first, second = _key(), _key()
    seen: list[object] = []
    with transaction.atomic():
        after_commit(cache, [("SET", first, "1", "EX", 60)])
        transaction.on_commit(lambda: seen.append((client.get(first), client.get(second))))
        after_commit(cache, [("SET", second, "1", "EX", 60)])
    assert seen == [(b"1", None)]  # the first was sent before the hook, the second after it
    assert client.get(second) == b"1" and sends == [1, 1]


def test_a_rolled_back_savepoint_drops_its_commands_and_keeps_the_others(sends):
    cache = redis_cache()
    client = cache._cache.get_client(None, write=True)
    kept, dropped, after = _key(), _key(), _key()
    with transaction.atomic():
        after_commit(cache, [("SET", kept, "1", "EX", 60)])
        try:
            with transaction.atomic():
                after_commit(cache, [("SET", dropped, "1", "EX", 60)])
                raise RuntimeError("rolled back")
        except RuntimeError:
            pass
        after_commit(cache, [("SET", after, "1", "EX", 60)])
    assert client.get(kept) == b"1" and client.get(after) == b"1"
    assert client.get(dropped) is None
    assert sends == [2]
    with pytest.raises(RuntimeError), transaction.atomic():
        after_commit(cache, [("SET", dropped, "1", "EX", 60)])
        raise RuntimeError("the whole transaction")
    assert client.get(dropped) is None and sends == [2]
    with transaction.atomic():  # a new transaction starts a new batch
        after_commit(cache, [("SET", dropped, "2", "EX", 60)])
    assert client.get(dropped) == b"2" and sends == [2, 1]


def test_a_submit_sends_its_push_message_and_cycle_request_together(team, fleet, sends):
    from django.core.cache import cache as default_cache

    from scheduler.admission import JobSpec, job_submit
    from scheduler.cycle_requests import CYCLE_DIRTY, CYCLE_REQUESTED

    default_cache.set(CYCLE_REQUESTED, 1, timeout=60)  # a cycle already requested: none queued
    job_submit(actor=team["owner"], project=team["a"], spec=JobSpec(name="x", command="true"))
    assert sends == [3]  # PUBLISH, and SET (queue changed), SET NX (a task?) in one round trip
    default_cache.delete(CYCLE_REQUESTED)
    job_submit(actor=team["owner"], project=team["a"], spec=JobSpec(name="y", command="true"))
    assert default_cache.get(CYCLE_REQUESTED) == 1  # stored as `cache.add` stores it
    assert default_cache.get(CYCLE_DIRTY) == 1  # and the queue marked changed, as `cache.set`
    assert sends == [3, 3]
