"""The planner's incremental bookkeeping agrees with recomputing from scratch."""

from __future__ import annotations

import math

import numpy as np

from scheduler.core.plan import PolicyConfig, _Planner, _Usage, order_queue, plan
from scheduler.core.scorers import unique_rows
from scheduler.core.state import ClusterState
from tests.unit.core_helpers import job, node, running, snapshot

NOW = 10_000.0


def test_release_timeline_stays_sorted_and_complete_through_placements_and_preemptions() -> None:
    nodes = [node(i, gpus=4) for i in range(1, 5)]
    work = [
        running(1, [100, 101], estimate=7200, started_at=0.0, priority=0),
        running(2, [200, 201, 202, 203], estimate=None, priority=0),  # unknown end: last
        running(3, [300], estimate=600, started_at=NOW - 100, priority=0),
        running(4, [400, 401, 402], estimate=3000, started_at=NOW - 2000, priority=2),
    ]
    snap = snapshot(nodes, work)
    queue = [
        job(10, gpus=1, runtime_estimate_s=900),
        job(11, gpus=2, runtime_estimate_s=None),
        job(12, gpus=4, priority=5, runtime_estimate_s=1200),  # preempts to fit
        job(13, gpus=8, runtime_estimate_s=60),  # waits
    ]
    cfg = PolicyConfig(queue="fcfs")
    planner = _Planner(snap, cfg, NOW, _Usage(), list(snap.running))
    planner.run(order_queue(queue, cfg, NOW, snap.quotas, snap.running))
    assert planner.placements and planner.preemptions  # the case covers both

    runtime = {j.job_id: j.runtime_estimate_s for j in queue}
    expected = [
        (max(NOW, w.expected_end() or math.inf), w.job_id)
        for w in snap.running
        if w.job_id not in planner.gone
    ] + [
        (NOW + r if (r := runtime[p.job_id]) is not None else math.inf, p.job_id)
        for p in planner.placements
    ]
    got = [(t, jid) for t, jid, _what in planner.release_events()]
    assert got == sorted(expected)
    assert not planner.gone & {jid for _t, jid in got}


def test_estimates_are_the_same_whether_asked_early_or_late_in_the_queue() -> None:
    """Estimates read the shared timeline; many estimates in one cycle stay consistent."""
    nodes = [node(1, gpus=4)]
    work = [running(i, [100 + i], estimate=1000 * (i + 1), started_at=NOW) for i in range(4)]
    queue = [job(20 + k, gpus=2, runtime_estimate_s=100) for k in range(6)]
    decided = plan(snapshot(nodes, work), queue, PolicyConfig(queue="fcfs"), NOW)
    starts = [decided.pending[j.job_id].estimated_start for j in queue]
    # two GPUs are free once the second-shortest running job ends, for every waiting job
    assert starts == [NOW + 2000] * len(queue)


def test_copy_shares_node_affinity_until_either_side_writes_that_row() -> None:
    st = ClusterState.from_snapshot(snapshot([node(1, gpus=4), node(2, gpus=4)]))
    before = [dict(a) for a in st.affinity]
    copy = st.copy()
    copy.take(0, [0], 1000, 0, 0, 0)
    assert [dict(a) for a in st.affinity] == before
    st.take(1, [0, 1], 1000, 0, 0, 0)
    assert dict(copy.affinity[1]) == before[1]
    assert copy.affinity[0]["1-gpu"] == before[0].get("1-gpu", 0) + 1
    assert st.affinity[1]["2-gpu"] == before[1].get("2-gpu", 0) + 1
    assert st.affinity[0] == before[0]


def test_row_grouping_follows_every_change_of_a_node() -> None:
    st = ClusterState.from_snapshot(snapshot([node(i, gpus=4) for i in range(1, 81)]))
    rows = np.arange(st.n_nodes, dtype=np.int64)
    reps, inverse = unique_rows(st, rows)
    assert reps.shape[0] == 1 and set(inverse.tolist()) == {0}
    st.take(5, [0], 1000, 0, 0, 0)
    reps, inverse = unique_rows(st, rows)
    assert reps.shape[0] == 2
    assert inverse[5] != inverse[4] and len(set(inverse[np.arange(80) != 5].tolist())) == 1
    st.give(5, 0, 1000, int(st.gpu_mem[5, 0]))
    reps, _ = unique_rows(st, rows)
    assert reps.shape[0] == 1
    st.give_cpu(7, -1000, 0)  # CPU changes regroup too
    reps, inverse = unique_rows(st, rows)
    assert reps.shape[0] == 2 and inverse[7] != inverse[6]
