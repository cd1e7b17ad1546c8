"""Table-driven tests of `scheduler.core.plan`: ordering, placement, reasons and policies."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler.core import PendingReason, PolicyConfig, ProjectQuota, plan
from scheduler.core.plan import order_queue
from tests.unit.core_helpers import job, node, running, snapshot

NOW = 100_000.0
GREEDY = PolicyConfig(backfill=False, strict_order=False, preemption=False, elastic=False)


def gpus_of(p, job_id):  # type: ignore[no-untyped-def]
    return next(pl for pl in p.placements if pl.job_id == job_id).shares


# ------------------------------------------------------------------ queue order
@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("fcfs", [1, 2, 3, 4]),
        ("sjf", [3, 2, 1, 4]),  # by estimate; no estimate last
        ("priority", [4, 2, 1, 3]),  # priority 5 first; 1 and 3 tie on priority, 1 older
    ],
)
def test_queue_order(policy: str, expected: list[int]) -> None:
    queue = [
        job(1, submitted_at=NOW - 10, runtime_estimate_s=3000),
        job(2, submitted_at=NOW - 9, runtime_estimate_s=600, priority=1),
        job(3, submitted_at=NOW - 8, runtime_estimate_s=60),
        job(4, submitted_at=NOW - 7, priority=5),
    ]
    cfg = PolicyConfig(queue=policy, aging_per_hour=0.0)
    assert [j.job_id for j in order_queue(queue, cfg, NOW, {})] == expected


def test_priority_aging_prevents_starvation() -> None:
    old_low = job(1, submitted_at=NOW - 10 * 3600, priority=0)
    new_high = job(2, submitted_at=NOW, priority=5)
    cfg = PolicyConfig(queue="priority", aging_per_hour=1.0)
    assert [j.job_id for j in order_queue([new_high, old_low], cfg, NOW, {})] == [1, 2]
    no_aging = PolicyConfig(queue="priority", aging_per_hour=0.0)
    assert [j.job_id for j in order_queue([new_high, old_low], no_aging, NOW, {})] == [2, 1]


def test_fair_share_interleaves_projects_by_weighted_usage() -> None:
    quotas = {
        "heavy": ProjectQuota(weight=1.0, decayed_usage=100.0),
        "light": ProjectQuota(weight=1.0, decayed_usage=0.0),
    }
    queue = [job(i, project="heavy", submitted_at=float(i)) for i in range(1, 4)]
    queue += [job(10 + i, project="light", submitted_at=50.0 + i) for i in range(3)]
    order = [j.job_id for j in order_queue(queue, PolicyConfig(queue="fairshare"), NOW, quotas)]
    assert order[:3] == [10, 11, 12]  # the light user goes first despite arriving later
    weighted = {
        "a": ProjectQuota(weight=4.0, decayed_usage=8.0),
        "b": ProjectQuota(weight=1.0, decayed_usage=4.0),
    }
    q2 = [job(1, project="b"), job(2, project="a", submitted_at=9.0)]
    assert (
        next(j.job_id for j in order_queue(q2, PolicyConfig(queue="fairshare"), NOW, weighted)) == 2
    )


# ------------------------------------------------------------------ placement and reasons
def test_whole_gpus_on_one_node() -> None:
    p = plan(snapshot([node(1, 8)]), [job(1, gpus=4)], GREEDY, NOW)
    shares = gpus_of(p, 1)
    assert len(shares) == 4 and {s.node_id for s in shares} == {1}
    assert all(s.milli == 1000 for s in shares)


def test_fraction_respects_capacity_and_memory() -> None:
    snap = snapshot([node(1, 1, used=[700])])
    p = plan(snap, [job(1, gpu_milli=300, gpu_memory_mib=1000), job(2, gpu_milli=100)], GREEDY, NOW)
    assert [pl.job_id for pl in p.placements] == [1]
    assert p.pending[2].reason is PendingReason.NO_CAPACITY
    big = plan(snapshot([node(1, 1)]), [job(3, gpu_milli=200, gpu_memory_mib=10**6)], GREEDY, NOW)
    assert big.pending[3].reason is PendingReason.NO_MATCHING_GPU


def test_oversubscribed_gpu_takes_up_to_its_capacity() -> None:
    snap = snapshot([node(1, 1, capacity=2000)])
    queue = [job(i, gpu_milli=600) for i in range(1, 5)]
    p = plan(snap, queue, GREEDY, NOW)
    assert sorted(pl.job_id for pl in p.placements) == [1, 2, 3]  # 3 × 600 ≤ 2000 < 4 × 600


def test_exclusive_gpus_take_no_fractions() -> None:
    p = plan(snapshot([node(1, 2, sharing="exclusive")]), [job(1, gpu_milli=500)], GREEDY, NOW)
    assert p.pending[1].reason is PendingReason.NO_MATCHING_GPU
    assert "sharing" in p.pending[1].message


@pytest.mark.parametrize(
    ("request_kw", "reason"),
    [
        ({"models": frozenset({"H100"})}, PendingReason.NO_MATCHING_GPU),
        ({"precisions": frozenset({"fp8"})}, PendingReason.NO_MATCHING_GPU),
        ({"min_gpu_memory_mib": 60_000}, PendingReason.NO_MATCHING_GPU),
        ({"gpus": 32}, PendingReason.NO_MATCHING_GPU),
        ({"node_selector": {"rack": "r9"}}, PendingReason.NODE_CONSTRAINTS),
        ({"pool": "elsewhere"}, PendingReason.NODE_CONSTRAINTS),
        ({"gpus": 2, "gpu_milli": 500}, PendingReason.INVALID_REQUEST),
        ({"nodes": 2}, PendingReason.INVALID_REQUEST),
    ],
)
def test_requests_that_can_never_run(request_kw: dict[str, object], reason: PendingReason) -> None:
    snap = snapshot([node(1, 8, "A100"), node(2, 8, "T4")])
    p = plan(snap, [job(1, **request_kw)], GREEDY, NOW)
    assert not p.placements
    assert p.pending[1].reason is reason
    assert p.pending[1].message


def test_model_and_precision_constraints_pick_matching_nodes() -> None:
    snap = snapshot([node(1, 8, "T4"), node(2, 8, "H100")])
    p = plan(
        snap, [job(1, precisions=frozenset({"fp8"})), job(2, models=frozenset({"T4"}))], GREEDY, NOW
    )
    assert {s.node_id for s in gpus_of(p, 1)} == {2}
    assert {s.node_id for s in gpus_of(p, 2)} == {1}


def test_gang_nodes_by_gpus_per_node() -> None:
    snap = snapshot([node(1, 4), node(2, 4), node(3, 4, used=[1000, 0, 0, 0])])
    p = plan(snap, [job(1, nodes=2, gpus_per_node=4)], GREEDY, NOW)
    shares = gpus_of(p, 1)
    assert len(shares) == 8 and {s.node_id for s in shares} == {1, 2}


def test_gang_waits_all_or_nothing() -> None:
    # 9 GPUs free, but no node has the 4 free that each gang member needs
    snap = snapshot([node(i, 4, used=[1000, 0, 0, 0]) for i in (1, 2, 3)])
    p = plan(snap, [job(1, nodes=2, gpus_per_node=4)], GREEDY, NOW)
    assert not p.placements
    assert p.pending[1].reason is PendingReason.WAITING_FOR_GANG
    assert "all or nothing" in p.pending[1].message


NO_GANGS = {"gang.members": "no", "gang.members.reason": "its job network fence is not in place"}


def test_gang_members_only_on_nodes_that_can_run_them() -> None:
    # nodes 2 and 3 fit the members best, but node 2's agent cannot run gang members
    snap = snapshot([node(1, 8), node(2, 4, labels=NO_GANGS), node(3, 4)])
    p = plan(snap, [job(1, nodes=2, gpus_per_node=4)], GREEDY, NOW)
    assert {s.node_id for s in gpus_of(p, 1)} == {1, 3}


def test_single_node_jobs_still_use_nodes_that_cannot_run_gang_members() -> None:
    snap = snapshot([node(1, 4, labels=NO_GANGS)])
    p = plan(snap, [job(1, gpus=4)], GREEDY, NOW)
    assert {s.node_id for s in gpus_of(p, 1)} == {1}


def test_a_gang_waits_in_words_for_nodes_that_can_run_its_members() -> None:
    snap = snapshot([node(1, 4, labels=NO_GANGS), node(2, 4), node(3, 4, labels=NO_GANGS)])
    p = plan(snap, [job(1, nodes=2, gpus_per_node=4)], GREEDY, NOW)
    assert not p.placements
    pending = p.pending[1]
    assert pending.reason is PendingReason.NODE_CONSTRAINTS
    assert "n1, n3 cannot run a multi-node gang's members" in pending.message
    assert "its job network fence is not in place" in pending.message


def test_a_spread_job_does_not_spread_onto_nodes_that_cannot_run_gang_members() -> None:
    # fewest nodes first would take node 1's 3 GPUs and one more: it cannot run a member
    snap = snapshot([node(1, 3, labels=NO_GANGS), node(2, 2), node(3, 2)])
    p = plan(snap, [job(1, gpus=4)], GREEDY, NOW)
    assert {s.node_id for s in gpus_of(p, 1)} == {2, 3}


def test_four_gpus_spread_two_plus_two() -> None:
    snap = snapshot([node(1, 2), node(2, 2), node(3, 4, used=[1000, 1000, 1000, 0])])
    p = plan(snap, [job(1, gpus=4)], GREEDY, NOW)
    shares = gpus_of(p, 1)
    per_node: dict[int, int] = {}
    for s in shares:
        per_node[s.node_id] = per_node.get(s.node_id, 0) + 1
    assert sum(per_node.values()) == 4 and len(per_node) == 2


def test_cpu_and_memory_limit_placement() -> None:
    snap = snapshot([node(1, 8, cpu=4_000), node(2, 8, cpu=32_000)])
    p = plan(snap, [job(1, gpus=1, cpu_milli=16_000)], GREEDY, NOW)
    assert {s.node_id for s in gpus_of(p, 1)} == {2}


def test_message_is_plain_language_with_position_and_estimate() -> None:
    busy = running(812, [100, 101], started_at=NOW - 600, estimate=3600)
    snap = snapshot([node(1, 2, "H100")], [busy])
    cfg = PolicyConfig(preemption=False)
    p = plan(snap, [job(1, gpus=2, models=frozenset({"H100"})), job(2, gpus=2)], cfg, NOW)
    first, second = p.pending[1], p.pending[2]
    assert first.reason is PendingReason.NO_CAPACITY and first.position == 1
    assert first.estimated_start == NOW + 3000
    assert first.message.startswith("Waiting for 2 × H100")
    assert "no job ahead" in first.message and "when job 812 ends" in first.message
    assert second.position == 2 and "1 job ahead" in second.message


# ------------------------------------------------------------------ quotas and budget
def test_quota_blocks_and_borrowing_places_preemptibly() -> None:
    snap = snapshot(
        [node(1, 8)],
        [running(9, [100, 101], project="alpha", preemptible=False)],
        quotas={"alpha": ProjectQuota(max_gpus=3)},
    )
    p = plan(snap, [job(1, gpus=2)], GREEDY, NOW)
    assert p.pending[1].reason is PendingReason.QUOTA
    assert "2 of 3 GPUs" in p.pending[1].message
    snap_b = snapshot(
        [node(1, 8)],
        [running(9, [100, 101], project="alpha", preemptible=False)],
        quotas={"alpha": ProjectQuota(max_gpus=3, allow_borrowing=True)},
    )
    pb = plan(snap_b, [job(1, gpus=2)], GREEDY, NOW)
    assert pb.placements[0].borrowed


def test_per_model_quota_steers_to_allowed_model() -> None:
    snap = snapshot(
        [node(1, 8, "H100"), node(2, 8, "A100")],
        quotas={"alpha": ProjectQuota(max_gpus_per_model={"H100": 0})},
    )
    p = plan(snap, [job(1, gpus=2)], GREEDY, NOW)
    assert {s.node_id for s in gpus_of(p, 1)} == {2}


def test_budget_exhausted() -> None:
    snap = snapshot([node(1, 8)], quotas={"alpha": ProjectQuota(budget_exhausted=True)})
    p = plan(snap, [job(1)], GREEDY, NOW)
    assert p.pending[1].reason is PendingReason.BUDGET
    assert "budget" in p.pending[1].message


# ------------------------------------------------------------------ backfill
def _backfill_case(cfg: PolicyConfig):  # type: ignore[no-untyped-def]
    # 8 GPUs; 6 busy until NOW+1000; the head wants all 8; 2 are idle meanwhile
    busy = running(
        50, list(range(100, 106)), started_at=NOW - 100, estimate=1100, preemptible=False
    )
    snap = snapshot([node(1, 8)], [busy])
    queue = [
        job(1, gpus=8, submitted_at=1.0, runtime_estimate_s=3600),
        job(3, gpus=2, submitted_at=2.0, runtime_estimate_s=5000),  # would delay the head
        job(2, gpus=2, submitted_at=3.0, runtime_estimate_s=500),  # ends before head starts
    ]
    return plan(snap, queue, cfg, NOW)


def test_easy_backfill_runs_only_jobs_that_do_not_delay_the_head() -> None:
    p = _backfill_case(PolicyConfig(backfill=True, preemption=False))
    assert [pl.job_id for pl in p.placements] == [2]
    assert p.reservations[0].job_id == 1 and p.reservations[0].start_at == NOW + 1000
    assert p.pending[1].reason is PendingReason.NO_CAPACITY
    assert p.pending[1].estimated_start == NOW + 1000


def test_backfill_blocked_job_gets_reservation_reason() -> None:
    p = _backfill_case(PolicyConfig(backfill=True, preemption=False))
    assert p.pending[3].reason is PendingReason.BLOCKED_BY_RESERVATION
    assert "job 1" in p.pending[3].message


def test_strict_fcfs_holds_everything_behind_the_head() -> None:
    p = _backfill_case(PolicyConfig(backfill=False, strict_order=True, preemption=False))
    assert not p.placements
    assert p.pending[2].reason is PendingReason.WAITING_IN_QUEUE
    assert p.pending[3].reason is PendingReason.WAITING_IN_QUEUE


# ------------------------------------------------------------------ preemption
def test_preemption_takes_lowest_priority_least_work_lost() -> None:
    work = [
        running(10, [100, 101], priority=1, started_at=NOW - 50),
        running(11, [102, 103], priority=0, started_at=NOW - 5000),
        running(12, [104, 105], priority=0, started_at=NOW - 60),
        running(13, [106, 107], priority=3, started_at=NOW - 60),
    ]
    p = plan(snapshot([node(1, 8)], work), [job(1, gpus=2, priority=5)], PolicyConfig(), NOW)
    assert [x.job_id for x in p.preemptions] == [12]
    assert p.preemptions[0].for_job_id == 1
    assert p.pending[1].reason is PendingReason.PREEMPTING


@pytest.mark.parametrize(
    ("victim_kw", "job_kw"),
    [
        ({"preemptible": False}, {}),
        ({"min_runtime_s": 3600, "started_at": NOW - 60}, {}),
        ({"priority": 5}, {}),  # equal priority: never
        ({}, {"preempted_by": frozenset({10})}),  # no loops
    ],
)
def test_protected_work_is_never_preempted(
    victim_kw: dict[str, object], job_kw: dict[str, object]
) -> None:
    kw: dict[str, object] = {"priority": 0, "started_at": NOW - 7200}
    kw.update(victim_kw)
    victim = running(10, list(range(100, 108)), **kw)  # type: ignore[arg-type]
    p = plan(
        snapshot([node(1, 8)], [victim]),
        [job(1, gpus=2, priority=5, **job_kw)],
        PolicyConfig(),
        NOW,
    )
    assert not p.preemptions
    assert p.pending[1].reason is PendingReason.NO_CAPACITY


def test_preemption_searches_are_budgeted_per_cycle() -> None:
    work = [
        running(10 + i, [100 + 2 * i, 101 + 2 * i], priority=0, started_at=NOW - 7200)
        for i in range(4)
    ]
    queue = [job(1, gpus=2, priority=5), job(2, gpus=2, priority=5)]
    p = plan(snapshot([node(1, 8)], work), queue, PolicyConfig(max_preemption_attempts=1), NOW)
    assert [x.for_job_id for x in p.preemptions] == [1]
    assert p.pending[2].reason is PendingReason.NO_CAPACITY  # its turn comes next cycle
    p = plan(snapshot([node(1, 8)], work), queue, PolicyConfig(), NOW)
    assert sorted(x.for_job_id for x in p.preemptions) == [1, 2]


def test_whole_gang_is_preempted() -> None:
    gang = running(10, [100, 101, 200, 201], priority=0, started_at=NOW - 100)
    snap = snapshot([node(1, 2), node(2, 2)], [gang])
    p = plan(snap, [job(1, gpus=1, priority=3)], PolicyConfig(), NOW)
    assert [x.job_id for x in p.preemptions] == [10]


# ------------------------------------------------------------------ elastic
def test_elastic_shrinks_before_anyone_is_preempted() -> None:
    el = running(10, list(range(100, 106)), priority=0, elastic_min=2, elastic_max=6)
    other = running(11, [106, 107], priority=0)
    p = plan(snapshot([node(1, 8)], [el, other]), [job(1, gpus=2, priority=5)], PolicyConfig(), NOW)
    assert not p.preemptions
    assert p.resizes and p.resizes[0].job_id == 10 and p.resizes[0].gpus == 4
    assert len(gpus_of(p, 1)) == 2


def test_elastic_grows_into_idle_gpus() -> None:
    el = running(10, [100, 101], elastic_min=1, elastic_max=5)
    p = plan(snapshot([node(1, 8)], [el]), [], PolicyConfig(), NOW)
    assert p.resizes[0].job_id == 10 and p.resizes[0].gpus == 5 and len(p.resizes[0].add) == 3


def test_elastic_request_starts_smaller() -> None:
    snap = snapshot([node(1, 4, used=[1000, 0, 0, 0])])
    p = plan(snap, [job(1, gpus=4, elastic_min=2, elastic_max=4)], GREEDY, NOW)
    assert len(gpus_of(p, 1)) == 3


# ------------------------------------------------------------------ reserved capacity
def test_reserved_gpus_are_lent_only_as_preemptible_and_reclaimed() -> None:
    quotas = {"owner": ProjectQuota(reserved={"H100": 4}), "other": ProjectQuota()}
    snap = snapshot([node(1, 4, "H100"), node(2, 4, "A100")], quotas=quotas)
    p = plan(snap, [job(1, project="other", gpus=4, models=frozenset({"H100"}))], GREEDY, NOW)
    assert p.placements[0].borrowed
    borrowed = running(1, [100, 101, 102, 103], project="other", priority=9, borrowed=True)
    snap2 = snapshot([node(1, 4, "H100"), node(2, 4, "A100")], [borrowed], quotas=quotas)
    p2 = plan(
        snap2, [job(2, project="owner", gpus=4, models=frozenset({"H100"}))], PolicyConfig(), NOW
    )
    assert [x.job_id for x in p2.preemptions] == [1]
    assert "reclaim" in p2.preemptions[0].reason


def test_unreserved_capacity_is_used_normally() -> None:
    quotas = {"owner": ProjectQuota(reserved={"H100": 2})}
    snap = snapshot([node(1, 8, "H100")], quotas=quotas)
    p = plan(snap, [job(1, project="other", gpus=4)], GREEDY, NOW)
    assert not p.placements[0].borrowed


# ------------------------------------------------------------------ pools and determinism
def test_per_pool_policy_override() -> None:
    snap = snapshot([node(1, 8, pool="batch"), node(2, 8, pool="interactive")])
    cfg = PolicyConfig(pools={"batch": PolicyConfig(scorer="first-fit")})
    p = plan(snap, [job(1, pool="batch"), job(2, pool="interactive")], cfg, NOW)
    assert {s.node_id for s in gpus_of(p, 1)} == {1}
    assert {s.node_id for s in gpus_of(p, 2)} == {2}


@pytest.mark.parametrize("scorer", ["random", "default", "fgd", "best-fit"])
def test_same_inputs_same_plan(scorer: str) -> None:
    snap = snapshot([node(i, 8, used=[500 * (i % 2)] * 3) for i in range(1, 6)])
    queue = [job(i, gpu_milli=250 if i % 3 else 1000, gpus=1 if i % 3 else 2) for i in range(1, 15)]
    cfg = PolicyConfig(scorer=scorer, seed=7)
    assert plan(snap, queue, cfg, NOW) == plan(snap, queue, cfg, NOW)


@pytest.mark.parametrize(
    ("request_kw", "reason", "says"),
    [
        # its only GPUs are on a draining node: it waits for them, it is not told "never"
        ({"models": frozenset({"A100"})}, PendingReason.NODES_UNAVAILABLE, "draining"),
        ({"gpus": 12}, PendingReason.NODES_UNAVAILABLE, "draining"),
        # what no node has, drained or not, still never fits ("can ever run it")
        ({"models": frozenset({"H100"})}, PendingReason.NO_MATCHING_GPU, "can ever run it"),
        ({"gpus": 32}, PendingReason.NO_MATCHING_GPU, "can ever run it"),
    ],
)
def test_a_drain_makes_jobs_wait_for_their_nodes(
    request_kw: dict[str, object], reason: PendingReason, says: str
) -> None:
    draining = dataclasses.replace(node(1, 8, "A100"), schedulable=False, unavailable="draining")
    p = plan(snapshot([draining, node(2, 8, "T4")]), [job(1, **request_kw)], GREEDY, NOW)
    assert not p.placements
    assert p.pending[1].reason is reason
    assert says in p.pending[1].message
    assert reason.can_start_later == (reason is PendingReason.NODES_UNAVAILABLE)


# A job whose node-local volume (or checkpoint) lives on one node runs there or waits for it.
WHY = "its volume 'ckpt' is on that node"


def test_a_pinned_job_lands_on_its_node_only() -> None:
    snap = snapshot([node(1, 8, used=[1000] * 6), node(2, 8)])
    p = plan(snap, [job(1, gpus=2, node="n1", node_why=WHY)], GREEDY, NOW)
    assert {s.node_id for s in gpus_of(p, 1)} == {1}


def test_a_pinned_job_waits_for_its_node_and_says_why() -> None:
    snap = snapshot([node(1, 8, used=[1000] * 8), node(2, 8)])
    p = plan(snap, [job(1, gpus=1, node="n1", node_why=WHY)], GREEDY, NOW)
    assert not p.placements
    assert p.pending[1].reason is PendingReason.NO_CAPACITY
    assert "on node n1 (its volume 'ckpt' is on that node)" in p.pending[1].message


def test_a_pinned_job_whose_node_is_out_of_service_waits_for_it() -> None:
    down = dataclasses.replace(node(1, 8), schedulable=False, unavailable="draining")
    p = plan(snapshot([down, node(2, 8)]), [job(1, node="n1", node_why=WHY)], GREEDY, NOW)
    assert p.pending[1].reason is PendingReason.NODES_UNAVAILABLE
    assert "n1 draining" in p.pending[1].message and WHY in p.pending[1].message


def test_a_job_pinned_to_a_node_that_is_gone_says_so() -> None:
    p = plan(snapshot([node(2, 8)]), [job(1, node="n1", node_why=WHY)], GREEDY, NOW)
    assert p.pending[1].reason is PendingReason.NODE_CONSTRAINTS
    assert "must run on node n1" in p.pending[1].message and WHY in p.pending[1].message


def test_fair_share_counts_a_time_sliced_share_as_the_part_of_its_device_it_holds() -> None:
    """Project a fills a time-sliced ×2 GPU with two 1000m shares: one GPU, as quotas count
    GPU-hours and billing bills it (not two). Project b holds two exclusive GPUs: more. So
    a's job goes first to the one free GPU, though b's was queued earlier."""
    nodes = [
        node(1, gpus=1, capacity=2000, sharing="time_slice"),
        node(2, gpus=3, capacity=1000, sharing="exclusive"),
    ]
    work = [
        running(1, [100], project="a"),
        running(2, [100], project="a"),
        running(3, [200], project="b"),
        running(4, [201], project="b"),
    ]
    queue = [job(11, project="b", submitted_at=1.0), job(12, project="a", submitted_at=2.0)]
    cfg = dataclasses.replace(GREEDY, queue="fairshare")
    decided = plan(snapshot(nodes, work), queue, cfg, NOW)
    assert [p.job_id for p in decided.placements] == [12]
    assert gpus_of(decided, 12)[0].gpu_id == 202
