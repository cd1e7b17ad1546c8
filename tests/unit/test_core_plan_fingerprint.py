"""A large seeded snapshot planned under several policies must give the recorded plans.

The fingerprints were recorded before `_Planner` was split into collaborators; any change to
`plan()`'s output (placements, preemptions, reservations, resizes, pending reasons, positions
and estimated starts) changes them. Re-record only for an intended change of the plan.
"""

from __future__ import annotations

import hashlib
import random

import pytest

from scheduler.core import JobRequest, Plan, PolicyConfig, ProjectQuota, Snapshot, plan
from tests.unit.core_helpers import job, node, running, snapshot

NOW = 1_000_000.0
MODELS = ["A100", "H100", "T4"]
PROJECTS = [f"p{i}" for i in range(8)]


def _snapshot(rng: random.Random) -> Snapshot:
    nodes = []
    for i in range(1, 121):
        gpus = rng.choice([1, 2, 4, 8, 8])
        nodes.append(
            node(
                i,
                gpus,
                MODELS[i % len(MODELS)],
                pool="default" if i % 6 else "batch",
                cpu=rng.choice([16_000, 64_000, 128_000]),
                mem=rng.choice([64_000, 512_000]),
                sharing=rng.choice(["time_slice", "exclusive", "mps"]),
                capacity=rng.choice([1000, 1000, 2000]),
                labels={"rack": f"r{i % 4}"},
            )
        )
    work = []
    jid = 100_000
    for nd in nodes:
        ids = [g.gpu_id for g in nd.gpus]
        rng.shuffle(ids)
        while ids and rng.random() < 0.6:
            k = rng.randint(1, len(ids))
            held, ids = ids[:k], ids[k:]
            elastic = rng.random() < 0.2
            work.append(
                running(
                    jid,
                    held,
                    project=rng.choice(PROJECTS),
                    priority=rng.randint(0, 4),
                    preemptible=rng.random() < 0.5,
                    started_at=NOW - rng.choice([30, 900, 20_000]),
                    min_runtime_s=rng.choice([0, 0, 600]),
                    estimate=rng.choice([None, 1800, 7200, 36_000]),
                    milli=rng.choice([1000, 1000, 500]),
                    borrowed=rng.random() < 0.15,
                    elastic_min=1 if elastic else None,
                    elastic_max=k + 2 if elastic else None,
                )
            )
            jid += 1
    quotas = {
        p: ProjectQuota(
            max_gpus=rng.choice([None, 8, 24, 64]),
            max_gpus_per_model={"H100": rng.randint(0, 16)} if rng.random() < 0.4 else {},
            allow_borrowing=rng.random() < 0.5,
            reserved={rng.choice(MODELS): rng.randint(0, 4)} if rng.random() < 0.4 else {},
            weight=rng.choice([1.0, 2.0, 0.5]),
            decayed_usage=rng.uniform(0, 100),
            budget_exhausted=p == "p7",
        )
        for p in PROJECTS
    }
    return snapshot(nodes, work, quotas)


def _queue(rng: random.Random) -> list[JobRequest]:
    out = []
    for i in range(1, 601):
        kind = rng.choice(["frac", "whole", "whole", "gang", "spread", "elastic", "cpu"])
        kw: dict[str, object] = {
            "project": rng.choice(PROJECTS),
            "priority": rng.randint(0, 5),
            "preemptible": rng.random() < 0.3,
            "cpu_milli": rng.choice([0, 1_000, 8_000, 32_000]),
            "memory_mib": rng.choice([0, 4_000, 64_000]),
            "runtime_estimate_s": rng.choice([None, 60, 1800, 7200, 50_000]),
            "submitted_at": NOW - rng.randint(0, 50_000),
        }
        if rng.random() < 0.4:
            kw["models"] = frozenset(rng.sample(MODELS, rng.randint(1, 2)))
        if rng.random() < 0.1:
            kw["pool"] = "batch"
        if rng.random() < 0.05:
            kw["node_selector"] = {"rack": f"r{rng.randint(0, 3)}"}
        if rng.random() < 0.05:
            kw["precisions"] = frozenset({"fp8"})
        if kind == "frac":
            kw.update(gpus=1, gpu_milli=rng.choice([100, 250, 500, 750]), gpu_memory_mib=2000)
        elif kind == "whole":
            kw.update(gpus=rng.choice([1, 1, 2, 4, 8]))
        elif kind == "gang":
            kw.update(nodes=rng.randint(2, 4), gpus_per_node=rng.choice([1, 2, 4]))
        elif kind == "spread":
            kw.update(gpus=rng.choice([12, 16, 24]))
        elif kind == "elastic":
            kw.update(gpus=rng.choice([4, 8]), elastic_min=1, elastic_max=16)
        else:
            kw.update(gpus=0)
        out.append(job(i, **kw))
    return out


def _fingerprint(p: Plan) -> str:
    parts = [
        repr(sorted(p.placements, key=lambda x: x.job_id)),
        repr(p.preemptions),
        repr(p.reservations),
        repr(p.resizes),
        repr(sorted(p.pending.items())),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


CASES = {
    "fcfs-default": PolicyConfig(),
    "priority-fgd": PolicyConfig(queue="priority", scorer="fgd", seed=3),
    "sjf-bestfit-nobackfill": PolicyConfig(queue="sjf", scorer="best-fit", backfill=False),
    "fairshare-random-greedy": PolicyConfig(
        queue="fairshare", scorer="random", backfill=False, strict_order=False, seed=5
    ),
    "priority-nopreempt-noelastic": PolicyConfig(
        queue="priority", preemption=False, elastic=False, max_estimates=10
    ),
    "pools": PolicyConfig(
        queue="priority",
        scorer="gpu-packing",
        pools={"batch": PolicyConfig(queue="sjf", scorer="first-fit", spread_gangs=False)},
    ),
}

# Recorded before the split of `_Planner`; re-recorded when `Resize` gained `for_job` (the
# plans did not change: with `for_job` left out of the repr the old values still match).
# fairshare re-recorded when fair share began counting a running share on a time-sliced GPU
# as the part of the device it holds (`device_share_milli`), as quotas and billing count it.
RECORDED = {
    "fcfs-default": "e83eb919c61123d9",
    "priority-fgd": "f88a77bb7dceba11",
    "sjf-bestfit-nobackfill": "616732ad3552a8a1",
    "fairshare-random-greedy": "178be48a56db38b9",
    "priority-nopreempt-noelastic": "4a8869c8cc4fa184",
    "pools": "c5fad6a7976d52f5",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_large_seeded_plan_matches_recorded_fingerprint(case: str) -> None:
    rng = random.Random(2026)
    snap = _snapshot(rng)
    queue = _queue(rng)
    p = plan(snap, queue, CASES[case], now=NOW)
    assert p.placements and p.pending  # the case exercises both outcomes
    assert _fingerprint(p) == RECORDED[case]
