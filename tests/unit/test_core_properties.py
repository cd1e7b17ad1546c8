"""Property tests: whatever the cluster and queue, a plan never breaks the invariants."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core import JobRequest, Plan, PolicyConfig, ProjectQuota, Snapshot, plan
from tests.unit.core_helpers import job, node, running, snapshot

NOW = 50_000.0
MODELS = ["A100", "H100", "T4"]
PROJECTS = ["alpha", "beta", "gamma"]


@st.composite
def clusters(draw: st.DrawFn) -> Snapshot:
    n = draw(st.integers(1, 5))
    nodes = []
    for i in range(1, n + 1):
        g = draw(st.integers(1, 4))
        used = draw(st.lists(st.sampled_from([0, 0, 250, 500, 1000]), min_size=g, max_size=g))
        nodes.append(
            node(
                i,
                g,
                draw(st.sampled_from(MODELS)),
                cpu=draw(st.sampled_from([2_000, 16_000, 64_000])),
                mem=draw(st.sampled_from([8_000, 256_000])),
                capacity=draw(st.sampled_from([1000, 1000, 2000])),
                used=used,
            )
        )
    work = []
    jid = 1000
    for nd in nodes:
        free = [gv.gpu_id for gv in nd.gpus if gv.used_milli == 0]
        if free and draw(st.booleans()):
            k = draw(st.integers(1, len(free)))
            work.append(
                running(
                    jid,
                    free[:k],
                    project=draw(st.sampled_from(PROJECTS)),
                    priority=draw(st.integers(0, 3)),
                    preemptible=draw(st.booleans()),
                    started_at=NOW - draw(st.sampled_from([10, 5000])),
                    min_runtime_s=draw(st.sampled_from([0, 600])),
                    borrowed=draw(st.booleans()),
                    elastic_min=1 if draw(st.booleans()) else None,
                    elastic_max=k + 2,
                )
            )
            jid += 1
    quotas = {
        p: ProjectQuota(
            max_gpus=draw(st.sampled_from([None, 2, 6])),
            max_gpus_per_model={"H100": draw(st.integers(0, 3))} if draw(st.booleans()) else {},
            allow_borrowing=draw(st.booleans()),
            reserved={draw(st.sampled_from(MODELS)): draw(st.integers(0, 2))},
        )
        for p in PROJECTS
    }
    return snapshot(nodes, work, quotas)


@st.composite
def queues(draw: st.DrawFn) -> list[JobRequest]:
    out = []
    for i in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["frac", "whole", "gang", "spread", "cpu"]))
        kw: dict[str, object] = {
            "project": draw(st.sampled_from(PROJECTS)),
            "priority": draw(st.integers(0, 5)),
            "preemptible": draw(st.booleans()),
            "cpu_milli": draw(st.sampled_from([0, 1_000, 8_000])),
            "memory_mib": draw(st.sampled_from([0, 4_000])),
            "runtime_estimate_s": draw(st.sampled_from([None, 60, 7200])),
        }
        if draw(st.booleans()):
            kw["models"] = frozenset(
                draw(st.lists(st.sampled_from(MODELS), min_size=1, max_size=2))
            )
        if kind == "frac":
            kw.update(gpus=1, gpu_milli=draw(st.sampled_from([100, 300, 600])), gpu_memory_mib=1000)
        elif kind == "whole":
            kw.update(gpus=draw(st.integers(1, 4)))
        elif kind == "gang":
            kw.update(nodes=draw(st.integers(1, 3)), gpus_per_node=draw(st.integers(1, 3)))
        elif kind == "spread":
            kw.update(gpus=draw(st.integers(2, 8)))
            if draw(st.booleans()):
                kw.update(elastic_min=1, elastic_max=8)
        else:
            kw.update(gpus=0)
        out.append(job(i + 1, submitted_at=NOW - draw(st.integers(0, 9999)), **kw))
    return out


configs = st.builds(
    PolicyConfig,
    queue=st.sampled_from(["fcfs", "sjf", "priority", "fairshare"]),
    scorer=st.sampled_from(["default", "fgd", "best-fit", "random", "gpu-packing"]),
    backfill=st.booleans(),
    preemption=st.booleans(),
    seed=st.integers(0, 3),
)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check_invariants(snap: Snapshot, queue: list[JobRequest], p: Plan) -> None:
    gpus = {g.gpu_id: (nd, g) for nd in snap.nodes for g in nd.gpus}
    jobs = {j.job_id: j for j in queue}
    milli: dict[int, int] = defaultdict(int)
    mem: dict[int, int] = defaultdict(int)
    cpu: dict[int, int] = defaultdict(int)
    ram: dict[int, int] = defaultdict(int)
    placed_usage: dict[str, int] = defaultdict(int)
    for pl in p.placements:
        j = jobs[pl.job_id]
        assert pl.job_id not in p.pending
        for s in pl.shares:
            nd, g = gpus[s.gpu_id]
            assert s.node_id == nd.node_id
            assert g.healthy
            if j.models:  # model constraints always respected
                assert g.model in j.models
            milli[s.gpu_id] += s.milli
            mem[s.gpu_id] += s.memory_mib
        per_node: dict[int, int] = defaultdict(int)
        for s in pl.shares:
            per_node[s.node_id] += 1
        # gangs all-or-nothing, exact layout
        if j.nodes is not None and j.gpus_per_node is not None:
            assert len(per_node) == j.nodes and set(per_node.values()) == {j.gpus_per_node}
        elif j.total_gpus > 0:
            lo = j.elastic_min if j.elastic_min is not None else j.total_gpus
            assert lo <= len(pl.shares) <= j.total_gpus
        share_nodes = list(per_node) or list(pl.node_ids)
        for nid in share_nodes:
            k = per_node.get(nid, 1)
            cpu[nid] += -(-j.cpu_milli * k // max(1, j.total_gpus)) if j.total_gpus else j.cpu_milli
            ram[nid] += (
                -(-j.memory_mib * k // max(1, j.total_gpus)) if j.total_gpus else j.memory_mib
            )
        if not pl.borrowed:
            placed_usage[j.project] += sum(min(s.milli, 1000) for s in pl.shares)
    for r in p.resizes:  # elastic jobs shrink (freeing shares) or grow
        for s in r.add:
            milli[s.gpu_id] += s.milli
        for s in r.release:
            milli[s.gpu_id] -= s.milli
    # no GPU, GPU memory, CPU or memory ever over-allocated
    for gid, m in milli.items():
        _nd, g = gpus[gid]
        assert g.used_milli + m <= g.capacity_milli
        assert g.used_memory_mib + mem[gid] <= g.memory_mib
    by_id = {nd.node_id: nd for nd in snap.nodes}
    for nid, c in cpu.items():
        assert c <= by_id[nid].cpu_milli_free
        assert ram[nid] <= by_id[nid].memory_mib_free
    # admitted (non-borrowed) work never takes a project over its quota
    for proj, q in snap.quotas.items():
        if q.max_gpus is None:
            continue
        before = sum(
            min(s.milli, 1000)
            for w in snap.running
            if w.project == proj and not w.borrowed
            for s in w.shares
        )
        if placed_usage[proj]:
            assert before + placed_usage[proj] <= q.max_gpus * 1000
    # preemption only of eligible victims, never inside the minimum runtime
    running_by_id = {w.job_id: w for w in snap.running}
    for pre in p.preemptions:
        v = running_by_id[pre.job_id]
        j = jobs[pre.for_job_id]
        assert NOW - v.started_at >= v.min_runtime_s
        assert v.job_id not in j.preempted_by
        assert v.borrowed or (v.preemptible and v.priority < j.priority)


@SETTINGS
@given(clusters(), queues(), configs)
def test_plan_never_breaks_invariants(
    snap: Snapshot, queue: list[JobRequest], cfg: PolicyConfig
) -> None:
    p = plan(snap, queue, cfg, NOW)
    _check_invariants(snap, queue, p)
    # every job gets exactly one outcome
    placed = {pl.job_id for pl in p.placements}
    assert placed | set(p.pending) == {j.job_id for j in queue}
    assert all(pd.message for pd in p.pending.values())


@SETTINGS
@given(clusters(), queues(), configs)
def test_plan_is_deterministic(snap: Snapshot, queue: list[JobRequest], cfg: PolicyConfig) -> None:
    assert plan(snap, queue, cfg, NOW) == plan(snap, queue, cfg, NOW)


@settings(max_examples=40, deadline=None)
@given(
    n_borrowed=st.integers(1, 4),
    reserved=st.integers(1, 4),
    borrower_priority=st.integers(0, 9),
)
def test_reserved_capacity_is_always_reclaimable(
    n_borrowed: int, reserved: int, borrower_priority: int
) -> None:
    # all H100s are lent out to other projects; the owner asks for its reservation back
    gpu_ids = list(range(100, 104))
    borrowers = [
        running(10 + i, [gpu_ids[i]], project="other", priority=borrower_priority, borrowed=True)
        for i in range(n_borrowed)
    ]
    quotas = {"owner": ProjectQuota(reserved={"H100": reserved})}
    busy = [g for g in gpu_ids if g not in {s.gpu_id for w in borrowers for s in w.shares}]
    blockers = [running(90, busy, project="third", preemptible=False)] if busy else []
    snap = snapshot([node(1, 4, "H100")], borrowers + blockers, quotas)
    want = min(reserved, n_borrowed)
    p = plan(snap, [job(1, project="owner", gpus=want, priority=0)], PolicyConfig(), NOW)
    freed = {pre.job_id for pre in p.preemptions}
    placed = sum(len(pl.shares) for pl in p.placements)
    assert placed == want or len(freed) >= want
