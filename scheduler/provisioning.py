"""Provider drivers and the autoscaler that drives them.

A provider creates, starts, stops, destroys and describes nodes. `simulated` makes virtual
nodes, each with its own agent process in simulated mode; `local` runs the agent on this host
against its real GPUs through NVML. A cloud or Kubernetes driver implements the same five verbs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from datetime import datetime
from typing import Any, ClassVar, Protocol

from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from portal.audit import audit_record
from scheduler.autoscale_rules import Decision, NodeInfo, ScalerInput, decide
from scheduler.models import (
    Allocation,
    Autoscaler,
    AutoscalerDecision,
    GpuModel,
    Job,
    JobState,
    Node,
    NodeEvent,
    Pool,
)
from scheduler.nodes.states import node_transition
from scheduler.nodes.tokens import agent_token_forget, node_issue_agent_token


class Provider(Protocol):
    name: ClassVar[str]

    def create(
        self, *, pool: Pool, gpu_model: GpuModel, gpus: int, autoscaler: Autoscaler | None
    ) -> Node: ...
    def start(self, node: Node, token: str) -> None: ...
    def stop(self, node: Node) -> None: ...
    def destroy(self, node: Node) -> None: ...
    def describe(self, node: Node) -> dict[str, Any]: ...


# What a spawned agent inherits from the portal's environment: an allow-list, so none of the
# portal's secrets (STRIPE_*, EMAIL_HOST_PASSWORD, METRICS_TOKEN, REDIS_URL...) reach the node.
AGENT_ENV_KEEP = frozenset(
    {"PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV"}
)


def _agent_env(node: Node, token: str, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in AGENT_ENV_KEEP or k.startswith("AGENT_")}
    env.update({"PORTAL_URL": settings.AGENT_PORTAL_URL, "NODE_TOKEN": token, **extra})
    return env


def node_label_set(node_id: int, key: str, value: str) -> dict[str, str]:
    """Set one label on the node's current labels, under the row's lock, and return them all.

    The agent just started may register at the same moment and rewrite the labels (its gang
    capability), under the same lock (`node_register`): merging into labels read earlier
    would undo its write, or it would undo this one."""
    with transaction.atomic():
        current = Node.objects.select_for_update().values_list("labels", flat=True).get(pk=node_id)
        labels = {**(current or {}), key: value}
        Node.objects.filter(pk=node_id).update(labels=labels)
    return labels


class AgentProcessProvider:
    """Starts the node agent as a local process (detached, its own session)."""

    name: ClassVar[str] = ""

    def _spawn(self, node: Node, token: str, extra: dict[str, str]) -> None:
        if not settings.PROVISIONING_SPAWN_AGENTS:
            return
        log_dir = settings.BASE_DIR / "var" / "log"
        log_dir.mkdir(parents=True, exist_ok=True)
        with open(log_dir / f"agent-{node.name}.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "agent"],
                env=_agent_env(node, token, extra),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=settings.BASE_DIR,
            )
        node.labels = node_label_set(node.pk, "agent_pid", str(proc.pid))

    def stop(self, node: Node) -> None:
        pid = node.labels.get("agent_pid")
        if pid and str(pid).isdigit():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(pid), signal.SIGTERM)

    def destroy(self, node: Node) -> None:
        self.stop(node)
        Node.objects.filter(pk=node.pk).update(agent_token_hash="")
        agent_token_forget(node.agent_token_hash)

    def describe(self, node: Node) -> dict[str, Any]:
        pid = node.labels.get("agent_pid")
        alive = False
        if pid and str(pid).isdigit():
            try:
                os.kill(int(pid), 0)
                alive = True
            except (ProcessLookupError, PermissionError):
                alive = False
        return {"provider": self.name, "agent_pid": pid, "agent_alive": alive, "state": node.state}


class SimulatedProvider(AgentProcessProvider):
    name: ClassVar[str] = Node.Provider.SIMULATED

    def create(
        self, *, pool: Pool, gpu_model: GpuModel, gpus: int, autoscaler: Autoscaler | None
    ) -> Node:
        name = f"sim-{gpu_model.name.split('-')[0].lower()}-{uuid.uuid4().hex[:6]}"
        node = Node.objects.create(
            name=name,
            pool=pool,
            provider=self.name,
            state=Node.State.PROVISIONING,
            cpu_milli=gpus * 16_000,
            memory_mib=gpus * 128 * 1024,
            labels={"gpu.model": gpu_model.name, "gpus": str(gpus)},
            autoscaler=autoscaler,
        )
        return node

    def start(self, node: Node, token: str) -> None:
        model = node.labels.get("gpu.model", "")
        count = node.labels.get("gpus", "1")
        self._spawn(
            node,
            token,
            {
                "AGENT_SIMULATE": "1",
                "AGENT_SIM_GPUS": f"{count}x{model}",
                "AGENT_HOSTNAME": node.name,
            },
        )


class LocalProvider(AgentProcessProvider):
    name: ClassVar[str] = Node.Provider.LOCAL

    def create(
        self, *, pool: Pool, gpu_model: GpuModel, gpus: int, autoscaler: Autoscaler | None
    ) -> Node:
        import socket

        return Node.objects.create(
            name=f"local-{socket.gethostname()}"[:63],
            pool=pool,
            provider=self.name,
            state=Node.State.PROVISIONING,
            cpu_milli=(os.cpu_count() or 1) * 1000,
            memory_mib=0,
            autoscaler=autoscaler,
        )

    def start(self, node: Node, token: str) -> None:
        self._spawn(node, token, {"AGENT_HOSTNAME": node.name})


PROVIDERS: dict[str, Provider] = {
    Node.Provider.SIMULATED.value: SimulatedProvider(),
    Node.Provider.LOCAL.value: LocalProvider(),
}


def provider_for(name: str) -> Provider:
    return PROVIDERS[name]


@transaction.atomic
def node_provision(
    *,
    provider: str,
    pool: Pool,
    gpu_model: GpuModel,
    gpus: int,
    autoscaler: Autoscaler | None = None,
) -> Node:
    """Create a node with the provider and start its agent after commit."""
    driver = provider_for(provider)
    node = driver.create(pool=pool, gpu_model=gpu_model, gpus=gpus, autoscaler=autoscaler)
    token = node_issue_agent_token(node=node)
    NodeEvent.objects.create(
        node=node, kind="provisioning", message=f"Provisioning with {provider}"
    )
    audit_record(
        actor=None, action="node.provision", target=node, data={"provider": provider, "gpus": gpus}
    )
    transaction.on_commit(lambda: driver.start(node, token))
    return node


@transaction.atomic
def node_deprovision(*, node: Node, reason: str) -> None:
    """Destroy an idle node. A node with running work is never removed."""
    node = Node.objects.select_for_update().get(pk=node.pk)
    if node.allocations.filter(ended_at__isnull=True).exists():
        return
    provider_for(node.provider).destroy(node)
    node_transition(
        node=node,
        to=Node.State.RETIRED,
        kind="deprovisioned",
        message=reason,
        action="node.deprovision",
        data={"reason": reason},
    )


def _scaler_input(scaler: Autoscaler, now: datetime) -> ScalerInput:
    nodes = list(
        Node.objects.filter(autoscaler=scaler).exclude(
            state__in=[Node.State.RETIRED, Node.State.LOST]
        )
    )
    busy = set(
        Allocation.objects.filter(node__in=nodes, ended_at__isnull=True).values_list(
            "node_id", flat=True
        )
    )
    last_end = dict(
        Allocation.objects.filter(node__in=nodes)
        .values("node_id")
        .annotate(last=Max("ended_at"))
        .values_list("node_id", "last")
    )
    infos = tuple(
        NodeInfo(
            name=n.name,
            state=n.state,
            busy=n.pk in busy,
            idle_for_s=(now - (last_end.get(n.pk) or n.created_at)).total_seconds(),
        )
        for n in nodes
    )
    # Queued GPUs for this model the scheduler could not place, per their pending reason.
    queued = Job.objects.filter(
        state=JobState.QUEUED,
        pending_reason__in=[
            "no_capacity",
            "no_matching_gpu",
            "waiting_for_gang",
            "waiting_in_queue",
        ],
    ).filter(gpu_model=scaler.gpu_model)
    unplaceable = sum(j.gpu_count for j in queued)
    ends = sorted(
        (j.estimated_start_at - now).total_seconds() for j in queued if j.estimated_start_at
    )
    return ScalerInput(
        min_nodes=scaler.min_nodes,
        max_nodes=scaler.max_nodes,
        warm_nodes=scaler.warm_nodes,
        gpus_per_node=scaler.gpus_per_node,
        provisioning_time_s=scaler.provisioning_time_s,
        idle_ttl_s=scaler.idle_ttl_s,
        nodes=infos,
        unplaceable_gpus=unplaceable,
        frees_in_s=max(0.0, ends[0]) if ends else None,
    )


def autoscale(*, now: datetime | None = None) -> list[AutoscalerDecision]:
    """Run every enabled autoscaler once; record each decision with its reason."""
    now = now or timezone.now()
    decisions = []
    for scaler in Autoscaler.objects.filter(enabled=True).select_related("pool", "gpu_model"):
        decision: Decision = decide(_scaler_input(scaler, now))
        names: list[str] = []
        if decision.action == "scale_up":
            for _ in range(decision.count):
                node = node_provision(
                    provider=scaler.provider,
                    pool=scaler.pool,
                    gpu_model=scaler.gpu_model,
                    gpus=scaler.gpus_per_node,
                    autoscaler=scaler,
                )
                names.append(node.name)
        elif decision.action == "scale_down":
            for node in Node.objects.filter(autoscaler=scaler, name__in=decision.remove):
                node_deprovision(node=node, reason=f"Autoscaler: {decision.reason}")
                names.append(node.name)
        last = scaler.decisions.first()
        if decision.action == "hold" and last is not None and last.reason == decision.reason:
            continue  # an unchanged hold is not news
        decisions.append(
            AutoscalerDecision.objects.create(
                autoscaler=scaler,
                action=decision.action,
                count=decision.count,
                nodes=names,
                reason=decision.reason,
            )
        )
    return decisions


__all__ = ["autoscale", "node_deprovision", "node_provision", "provider_for"]
