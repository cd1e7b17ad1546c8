"""Gangs as one unit (rendezvous environment, all members or none) and elastic resizes carried
out (the planner's shrink no longer livelocks a waiting job), on PostgreSQL."""

from __future__ import annotations

import pytest
from django.utils import timezone

from portal.models import AuditEvent
from scheduler.admission import JobSpec, job_submit
from scheduler.cycle import run_cycle
from scheduler.models import Allocation, GpuModel, Job, JobEvent, JobMember, JobState, Node, Pool
from scheduler.nodes import assignments_for, node_issue_agent_token
from scheduler.nodes.reports import ExitReport, job_exited, job_started
from scheduler.seed import catalog_seed, node_register_simulated

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("ckpt_volume")]


def submit(team, *, min_runtime_s: int | None = None, **spec) -> Job:
    spec.setdefault("gpu_model", GpuModel.objects.get(name="H100-80GB-SXM"))
    (job,) = job_submit(
        actor=team["member"], project=team["a"], spec=JobSpec(command="true", **spec)
    )
    if min_runtime_s is not None:
        Job.objects.filter(pk=job.pk).update(min_runtime_s=min_runtime_s)
    return job


def start_everywhere(job: Job) -> None:
    job.refresh_from_db()
    for node in Node.objects.filter(allocations__job=job, allocations__ended_at__isnull=True):
        job_started(node=node, job_id=job.pk, attempt=job.attempt, pid=1)


def exit_on(job: Job, node: Node, code: int | None, reason: str = "exited") -> Job:
    job.refresh_from_db()
    return job_exited(
        node=node,
        job_id=job.pk,
        report=ExitReport(attempt=job.attempt, exit_code=code, signal=None, reason=reason),
    )


def env_on(node: Node, job: Job) -> dict[str, str]:
    (a,) = [a for a in assignments_for(node) if a["job_id"] == job.pk]
    return a["env"]


# ---------------------------------------------------------------------------------- gangs


@pytest.fixture
def gang(team, fleet):
    for name, addr in (("h1", "10.0.0.1"), ("h2", "10.0.0.2")):
        Node.objects.filter(name=name).update(address=addr)
    job = submit(team, name="g", gpus=2, nodes=2, gpus_per_node=1)
    run_cycle()
    job.refresh_from_db()
    assert job.state == JobState.SCHEDULED
    members = list(JobMember.objects.filter(job=job).order_by("rank"))
    return {"job": job, "members": members, **team, **fleet}


def test_every_member_gets_the_rendezvous_torchrun_reads(gang):
    job, (m0, m1) = gang["job"], gang["members"]
    assert (m0.rank, m1.rank) == (0, 1) and m0.node_id != m1.node_id
    assert job.rendezvous_port in range(29400, 30000)
    env0, env1 = env_on(m0.node, job), env_on(m1.node, job)
    master = Node.objects.get(pk=m0.node_id).address
    for rank, env in ((0, env0), (1, env1)):
        assert env["MASTER_ADDR"] == master
        assert env["MASTER_PORT"] == str(job.rendezvous_port)
        assert (env["WORLD_SIZE"], env["NNODES"], env["LOCAL_WORLD_SIZE"]) == ("2", "2", "1")
        assert (env["RANK"], env["NODE_RANK"], env["LOCAL_RANK"]) == (str(rank), str(rank), "0")


def test_a_second_gang_gets_another_port_at_the_same_rendezvous(gang, team):
    Node.objects.filter(name="h2").update(address="10.0.0.1")  # two nodes, one address
    other = submit(team, name="g2", gpus=2, nodes=2, gpus_per_node=1)
    run_cycle()
    other.refresh_from_db()
    assert other.state == JobState.SCHEDULED
    assert other.rendezvous_port != gang["job"].rendezvous_port


def test_single_node_job_is_a_world_of_its_gpus(team, fleet):
    job = submit(team, name="one", gpus=2)
    run_cycle()
    job.refresh_from_db()
    node = Allocation.objects.filter(job=job).first().node
    env = env_on(node, job)
    assert (env["WORLD_SIZE"], env["RANK"], env["NNODES"], env["MASTER_ADDR"]) == (
        "2",
        "0",
        "1",
        "127.0.0.1",
    )
    assert "MASTER_PORT" not in env  # the agent picks a port free on its node
    assert not JobMember.objects.filter(job=job).exists() and job.rendezvous_port is None


def test_gang_runs_once_every_member_started_and_succeeds_once_all_exit_zero(gang):
    job, (m0, m1) = gang["job"], gang["members"]
    job_started(node=m0.node, job_id=job.pk, attempt=job.attempt, pid=1)
    job.refresh_from_db()
    assert job.state == JobState.STARTING
    job_started(node=m1.node, job_id=job.pk, attempt=job.attempt, pid=2)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert exit_on(job, m0.node, 0).state == JobState.RUNNING  # the first member done: not yet
    assert Allocation.objects.filter(job=job, ended_at__isnull=True).count() == 2
    assert exit_on(job, m1.node, 0).state == JobState.SUCCEEDED
    assert set(JobMember.objects.filter(job=job).values_list("state", flat=True)) == {"succeeded"}


def test_one_member_failing_stops_the_others_and_fails_the_job_once(gang):
    job, (m0, m1) = gang["job"], gang["members"]
    start_everywhere(job)
    failed = exit_on(job, m1.node, 1)
    assert failed.state == JobState.FAILED
    assert "exit code 1" in failed.failure_reason and m1.node.name in failed.failure_reason
    # rank 0 is no longer assigned: its agent stops it (SIGTERM, the job's grace, SIGKILL)
    assert [a for a in assignments_for(m0.node) if a["job_id"] == job.pk] == []
    assert not Allocation.objects.filter(job=job, ended_at__isnull=True).exists()
    states = dict(JobMember.objects.filter(job=job).values_list("rank", "state"))
    assert states == {0: "stopped", 1: "failed"}
    # rank 0's own exit report, after the stop, changes nothing: the job failed once
    assert exit_on(job, m0.node, None, "killed").state == JobState.FAILED
    assert JobEvent.objects.filter(job=job, to_state=JobState.FAILED).count() == 1


def test_a_failing_member_requeues_the_whole_gang_per_its_restart_policy(team, fleet):
    job = submit(team, name="g", gpus=2, nodes=2, gpus_per_node=1, max_restarts=1)
    run_cycle()
    start_everywhere(job)
    node = JobMember.objects.get(job=job, rank=1).node
    assert exit_on(job, node, 3).state == JobState.QUEUED
    assert set(JobMember.objects.filter(job=job, attempt=1).values_list("state", flat=True)) == {
        "stopped",
        "failed",
    }
    run_cycle()
    job.refresh_from_db()
    assert job.state == JobState.SCHEDULED and job.attempt == 2
    assert JobMember.objects.filter(job=job, attempt=2).count() == 2


def test_a_lost_node_requeues_the_whole_gang(gang):
    from scheduler.nodes.faults import requeue_after_fault

    job = gang["job"]
    Job.objects.filter(pk=job.pk).update(checkpoint="ckpt:ckpt")
    start_everywhere(job)
    job = Job.objects.get(pk=job.pk)
    requeue_after_fault(job, "node h2 lost", end_reason="node_lost", actor="health")
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.resume
    assert set(JobMember.objects.filter(job=job).values_list("state", flat=True)) == {"lost"}
    assert not Allocation.objects.filter(job=job, ended_at__isnull=True).exists()


# ---------------------------------------------------------------------------------- elastic


@pytest.fixture
def two_eights(team):
    """Two nodes of 8 × H100 each, with agent tokens."""
    catalog_seed()
    pool, _ = Pool.objects.get_or_create(name="default")
    h100 = GpuModel.objects.get(name="H100-80GB-SXM")
    nodes = [
        node_register_simulated(
            name=name,
            pool=pool,
            gpu_model=h100,
            gpu_count=8,
            cpu_milli=256_000,
            memory_mib=2_000_000,
            state="ready",
        )
        for name in ("n1", "n2")
    ]
    for node in nodes:
        node_issue_agent_token(node=node)
    return nodes


def test_elastic_shrink_blocker_and_waiting_job_do_not_livelock(team, two_eights):
    """The mission's case: an elastic job on 4 H100s, a blocker on the other node, a waiting
    6-GPU job. Before, every cycle planned "shrink to 2 and place the new job", apply dropped
    the placement, and the waiting job stayed queued with a blank reason."""
    elastic = submit(
        team,
        name="el",
        gpus=4,
        elastic_min=2,
        elastic_max=4,
        min_runtime_s=0,
        checkpoint="ckpt:ckpt",
    )
    blocker = submit(team, name="blocker", gpus=8)
    run_cycle()
    start_everywhere(elastic)
    start_everywhere(blocker)
    el_node = Allocation.objects.filter(job=elastic).first().node
    assert Allocation.objects.filter(job=blocker).exclude(node=el_node).count() == 8

    waiting = submit(team, name="six", gpus=6)
    for _ in range(3):  # the plan is carried out once, and not planned again unchanged
        run_cycle()
        elastic.refresh_from_db()
        waiting.refresh_from_db()
        assert elastic.state == JobState.PREEMPTING
        assert elastic.resize["to"] == 2 and elastic.resize["for_job"] == waiting.pk
        assert waiting.state == JobState.QUEUED
        assert waiting.pending_reason and waiting.pending_message  # every waiting job says why
    assert JobEvent.objects.filter(job=elastic, to_state=JobState.PREEMPTING).count() == 1
    shrink = JobEvent.objects.get(job=elastic, to_state=JobState.PREEMPTING)
    assert f"waiting job {waiting.pk}" in shrink.reason and shrink.data["resize"]["to"] == 2
    (stop,) = [a for a in assignments_for(el_node) if a["job_id"] == elastic.pk]
    assert stop["stop_reason"] == "resize" and stop["action"] == "stop"

    # the agent stopped it (SIGTERM, grace): it restarts at once on the 2 GPUs it kept
    exit_on(elastic, el_node, None, "preempted")
    elastic.refresh_from_db()
    assert elastic.state == JobState.SCHEDULED and elastic.gpus == 2 and elastic.resume
    assert elastic.attempt == 2 and not elastic.resize
    held = Allocation.objects.filter(job=elastic, ended_at__isnull=True)
    assert held.count() == 2 and {a.node_id for a in held} == {el_node.pk}
    (a,) = [a for a in assignments_for(el_node) if a["job_id"] == elastic.pk]
    assert (a["env"]["RESUME"], a["env"]["WORLD_SIZE"], len(a["gpu_uuids"])) == ("1", "2", 2)
    assert (
        AuditEvent.objects.filter(
            action__in=["job.resize", "job.resized"], target_id=str(elastic.pk)
        ).count()
        == 2
    )

    run_cycle()
    waiting.refresh_from_db()
    assert waiting.state == JobState.SCHEDULED
    assert Allocation.objects.filter(job=waiting, node=el_node).count() == 6


def test_elastic_job_grows_into_idle_gpus_when_nothing_waits(team, two_eights):
    blocker = submit(team, name="blocker", gpus=8)
    elastic = submit(
        team,
        name="el",
        gpus=6,
        elastic_min=2,
        elastic_max=8,
        min_runtime_s=0,
        checkpoint="ckpt:ckpt",
    )
    filler = submit(team, name="filler", gpus=2, runtime_estimate_s=60)
    run_cycle()
    for job in (blocker, elastic, filler):
        start_everywhere(job)
    node = Allocation.objects.filter(job=elastic).first().node
    exit_on(filler, Allocation.objects.filter(job=filler).first().node, 0)  # 2 GPUs go idle
    run_cycle()  # nothing is queued: the cycle still plans, and grows the elastic job
    elastic.refresh_from_db()
    assert elastic.state == JobState.PREEMPTING
    assert (elastic.resize["from"], elastic.resize["to"]) == (6, 8)
    assert elastic.resize["reason"] == "grown into idle GPUs"
    exit_on(elastic, node, None, "preempted")
    elastic.refresh_from_db()
    # it restarts at once on its GPUs and the idle ones held for it (no cycle in between)
    assert elastic.state == JobState.SCHEDULED and elastic.gpus == 8 and elastic.resume
    assert elastic.attempt == 2 and not elastic.resize
    assert Allocation.objects.filter(job=elastic, ended_at__isnull=True).count() == 8
    (a,) = [a for a in assignments_for(node) if a["job_id"] == elastic.pk]
    assert (a["env"]["RESUME"], a["env"]["WORLD_SIZE"], len(a["gpu_uuids"])) == ("1", "8", 8)


@pytest.fixture
def growing(team, two_eights):
    """A blocker on one node; an elastic job (6 of up to 8) and a 2-GPU filler on the other.
    The filler ends: the cycle grows the elastic job into its 2 idle GPUs."""
    blocker = submit(team, name="blocker", gpus=8)
    elastic = submit(
        team,
        name="el",
        gpus=6,
        elastic_min=2,
        elastic_max=8,
        min_runtime_s=0,
        checkpoint="ckpt:ckpt",
    )
    filler = submit(team, name="filler", gpus=2, runtime_estimate_s=60)
    run_cycle()
    for job in (blocker, elastic, filler):
        start_everywhere(job)
    node = Allocation.objects.filter(job=elastic).first().node
    idle = set(
        Allocation.objects.filter(job=filler).values_list("gpu_id", flat=True)
    )  # what the grow is planned into
    exit_on(filler, Allocation.objects.filter(job=filler).first().node, 0)
    run_cycle()
    elastic.refresh_from_db()
    assert elastic.state == JobState.PREEMPTING and elastic.resize["to"] == 8
    assert {h["gpu"] for h in elastic.resize["hold"]} == idle
    return {"elastic": elastic, "node": node, "idle": idle}


def test_a_grow_holds_the_idle_gpus_while_the_job_checkpoints(team, growing):
    """Work that arrives between the grow's signal and the job's restart does not take the
    GPUs it was grown into: the job restarts at the planned size."""
    elastic, node = growing["elastic"], growing["node"]
    thief = submit(team, name="thief", gpus=2)
    for _ in range(2):
        run_cycle()
        thief.refresh_from_db()
        assert thief.state == JobState.QUEUED and thief.pending_reason  # it says why it waits
    assert not Allocation.objects.filter(job=thief).exists()
    grow = JobEvent.objects.get(job=elastic, to_state=JobState.PREEMPTING)
    assert "2 idle GPU(s) held for it" in grow.reason and "hold" not in grow.data["resize"]

    exit_on(elastic, node, 0, "preempted")  # checkpointed on SIGTERM, exited 0
    elastic.refresh_from_db()
    assert elastic.state == JobState.SCHEDULED and elastic.gpus == 8 and elastic.attempt == 2
    now_held = set(
        Allocation.objects.filter(job=elastic, ended_at__isnull=True).values_list(
            "gpu_id", flat=True
        )
    )
    assert len(now_held) == 8 and growing["idle"] <= now_held
    assert all(a.billed_milli == 1000 for a in Allocation.objects.filter(job=elastic, attempt=2))
    run_cycle()
    thief.refresh_from_db()
    assert thief.state == JobState.QUEUED  # nothing free on either node


def test_the_hold_ends_when_the_grow_is_abandoned(team, growing):
    """Cancelled while it checkpoints: the held GPUs are free again with its own."""
    elastic = growing["elastic"]
    whole_node = submit(team, name="eight", gpus=8)  # fits only with the held GPUs
    run_cycle()
    whole_node.refresh_from_db()
    assert whole_node.state == JobState.QUEUED
    from scheduler.admission import job_cancel

    job_cancel(actor=team["member"], job=elastic)
    elastic.refresh_from_db()
    assert elastic.state == JobState.CANCELLED and not elastic.resize
    run_cycle()
    whole_node.refresh_from_db()
    assert whole_node.state == JobState.SCHEDULED
    placed = set(Allocation.objects.filter(job=whole_node).values_list("gpu_id", flat=True))
    assert growing["idle"] <= placed


def test_a_held_gpu_that_fails_meanwhile_requeues_the_grow(team, growing):
    from scheduler.models import Gpu

    elastic, node = growing["elastic"], growing["node"]
    Gpu.objects.filter(pk=min(growing["idle"])).update(health=Gpu.Health.UNHEALTHY)
    exit_on(elastic, node, None, "preempted")
    elastic.refresh_from_db()
    assert elastic.state == JobState.QUEUED and elastic.gpus == 8 and not elastic.resize
    out = JobEvent.objects.filter(job=elastic, to_state=JobState.QUEUED).last()
    assert "no longer usable" in out.reason


def test_a_resize_cut_short_by_a_lost_node_leaves_no_resize_behind(team, growing):
    from scheduler.nodes.faults import requeue_after_fault

    elastic = Job.objects.get(pk=growing["elastic"].pk)
    requeue_after_fault(elastic, "node n1 lost", end_reason="node_lost", actor="health")
    elastic.refresh_from_db()
    assert elastic.state == JobState.QUEUED and not elastic.resize


def test_users_resize_through_the_api_within_the_elastic_range(team, fleet, api):
    elastic = submit(team, name="el", gpus=2, elastic_min=1, elastic_max=2, checkpoint="ckpt:ckpt")
    plain = submit(team, name="plain", gpus=1)
    run_cycle()
    start_everywhere(elastic)
    start_everywhere(plain)
    member, viewer = api(team["member"]), api(team["viewer"])
    url = f"/api/v1/jobs/{elastic.pk}/resize"
    assert viewer.post(url, {"gpus": 1}, format="json").status_code == 403
    bad = member.post(url, {"gpus": 3}, format="json")
    assert bad.status_code == 400 and "1 to 2" in bad.json()["message"]
    assert member.post(url, {"gpus": "x"}, format="json").status_code == 400
    not_elastic = member.post(f"/api/v1/jobs/{plain.pk}/resize", {"gpus": 1}, format="json")
    assert not_elastic.status_code == 400
    ok = member.post(url, {"gpus": 1}, format="json")
    assert ok.status_code == 200 and ok.json()["state"] == "preempting"
    again = member.post(url, {"gpus": 1}, format="json")
    assert again.status_code == 409
    elastic.refresh_from_db()
    assert elastic.resize["to"] == 1 and team["member"].email in elastic.resize["reason"]
    assert AuditEvent.objects.filter(action="job.resize", target_id=str(elastic.pk)).exists()
    detail = member.get(f"/api/v1/jobs/{elastic.pk}").json()
    assert detail["resize"]["to"] == 1 and detail["members"] == []
    node = Allocation.objects.filter(job=elastic).first().node
    exit_on(elastic, node, None, "preempted")
    elastic.refresh_from_db()
    assert elastic.state == JobState.SCHEDULED and elastic.gpus == 1
    assert timezone.now() >= elastic.queued_at


def test_the_job_page_shows_the_members_their_nodes_and_states(gang, client):
    job, (m0, m1) = gang["job"], gang["members"]
    start_everywhere(job)
    exit_on(job, m1.node, 1)
    client.force_login(gang["member"])
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    table = page.split('data-testid="members"', 1)[1].split("</table>", 1)[0]
    for node, state in ((m0.node.name, "stopped"), (m1.node.name, "failed")):
        assert node in table and f"state-{state}" in table
    assert "rendezvous" in table


def test_the_job_page_resizes_an_elastic_job(team, fleet, client):
    elastic = submit(team, name="el", gpus=2, elastic_min=1, elastic_max=2, checkpoint="ckpt:c")
    run_cycle()
    start_everywhere(elastic)
    client.force_login(team["member"])
    assert 'data-testid="resize-form"' in client.get(f"/jobs/{elastic.pk}/").content.decode()
    bad = client.post(f"/jobs/{elastic.pk}/resize/", {"gpus": "5"}, follow=True)
    assert "outside that range" in bad.content.decode()
    assert Job.objects.get(pk=elastic.pk).state == JobState.RUNNING
    client.post(f"/jobs/{elastic.pk}/resize/", {"gpus": "1"})
    elastic.refresh_from_db()
    assert elastic.state == JobState.PREEMPTING and elastic.resize["to"] == 1
    assert 'data-testid="resizing"' in client.get(f"/jobs/{elastic.pk}/").content.decode()


def test_a_resize_never_confirmed_is_requeued_at_its_new_size(team, fleet, api):
    from datetime import timedelta

    elastic = submit(team, name="el", gpus=2, elastic_min=1, elastic_max=2, checkpoint="ckpt:c")
    run_cycle()
    start_everywhere(elastic)
    assert (
        api(team["member"])
        .post(f"/api/v1/jobs/{elastic.pk}/resize", {"gpus": 1}, format="json")
        .status_code
        == 200
    )
    deadline = Job.objects.get(pk=elastic.pk).preempt_deadline
    run_cycle(now=deadline + timedelta(seconds=61))
    elastic.refresh_from_db()
    assert elastic.state in (JobState.QUEUED, JobState.SCHEDULED)  # requeued, maybe placed
    assert elastic.gpus == 1 and elastic.resume and not elastic.resize
    assert (
        JobEvent.objects.filter(
            job=elastic, from_state=JobState.PREEMPTING, to_state=JobState.QUEUED
        )
        .get()
        .reason.startswith("Resized from 2 to 1 GPUs")
    )


# ------------------------------------------------------- nodes that cannot run gang members


def register(node: Node, token: str, **extra) -> None:
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    gpus = [
        {"index": g.index, "uuid": g.uuid, "name": g.model.name, "memory_mib": g.memory_mib}
        for g in node.gpus.select_related("model").order_by("index")
    ]
    body = {"hostname": node.name, "gpus": gpus, **extra}
    resp = client.post("/api/agent/v1/register", body, format="json")
    assert resp.status_code == 200, resp.content


def test_a_node_whose_agent_cannot_run_gang_members_gets_none(team, fleet, client, make_user):
    h1 = fleet["nodes"]["h1"]
    why = "its job network fence is not in place: nft refused the fence: permission denied"
    register(h1, fleet["tokens"]["h1"], gang_members=False, gang_members_reason=why)
    h1.refresh_from_db()
    assert h1.labels["gang.members"] == "no" and h1.gang_members_refused == why
    assert h1.events.filter(kind="gang_members", message__contains=why).exists()
    audit = AuditEvent.objects.filter(action="node.register").latest("pk")
    assert audit.data["gang_members"] is False
    client.force_login(make_user(staff=True))
    assert why in client.get(f"/ops/nodes/{h1.pk}/").content.decode()
    assert "no gang members" in client.get("/ops/nodes/").content.decode()

    gang = submit(team, name="g", gpus=2, nodes=2, gpus_per_node=1)
    single = submit(team, name="s", gpus=2)
    run_cycle()
    gang.refresh_from_db()
    single.refresh_from_db()
    assert gang.state == JobState.QUEUED
    assert "h1 cannot run a multi-node gang's members" in gang.pending_message
    assert why in gang.pending_message
    assert single.state == JobState.SCHEDULED  # single-node jobs may still go there

    # an agent that says nothing (one from before it could say) is taken to be able to
    Job.objects.filter(pk=single.pk).update(state=JobState.CANCELLED)
    Allocation.objects.filter(job=single).update(ended_at=timezone.now())
    register(h1, fleet["tokens"]["h1"])
    h1.refresh_from_db()
    assert h1.labels["gang.members"] == "yes" and h1.gang_members_refused == ""
    run_cycle()
    gang.refresh_from_db()
    assert gang.state == JobState.SCHEDULED
    assert {m.node.name for m in JobMember.objects.filter(job=gang)} == {"h1", "h2"}
