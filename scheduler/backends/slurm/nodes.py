"""Slurm's nodes, mirrored as our Node and Gpu rows, and drain/resume from the portal.

A mirrored node has provider "slurm" and never a heartbeat: our cycle never places work on it
(it is not schedulable without one) and the lost-node sweep never watches it. Its labels keep
what Slurm says (state, flags, GRES, GPUs in use, reason); its state is ours in Slurm's words:
idle/mixed/allocated → ready, drain(ing) → draining/cordoned, down → unhealthy. The Gpu rows
let allocations (and so the billing ledger) name the GPUs Slurm gave a job.
"""

from __future__ import annotations

import re
from typing import Any

from django.db import transaction
from django.utils import timezone

from portal.audit import audit_record
from portal.errors import DomainError
from portal.models import User
from scheduler.backends.slurm.client import SlurmError, cluster_for
from scheduler.models import Gpu, GpuModel, Node, NodeEvent, Pool

_GRES = re.compile(r"^gpu(?::(?P<type>[^:(]+))?:(?P<count>\d+)")
_IDX = re.compile(r"IDX:(?P<idx>[\d,\-]+)")


def parse_gres(gres: str) -> list[tuple[str, int]]:
    """'gpu:a100:4,gpu:h100:2(S:0)' → [('a100', 4), ('h100', 2)] (untyped: '')."""
    out = []
    for part in re.split(r",(?=gpu)", gres or ""):
        m = _GRES.match(part.strip())
        if m:
            out.append((m.group("type") or "", int(m.group("count"))))
    return out


def parse_indexes(detail: str) -> list[int]:
    """'gpu:a100:2(IDX:0-1,3)' → [0, 1, 3]."""
    m = _IDX.search(detail or "")
    if not m:
        return []
    out: list[int] = []
    for part in m.group("idx").split(","):
        if "-" in part:
            lo, hi = part.split("-", 1)
            out.extend(range(int(lo), int(hi) + 1))
        elif part:
            out.append(int(part))
    return out


def hostlist(text: str) -> list[str]:
    """'gpu-[a-b],n1' style lists → names (Slurm's own compressed form, simple cases)."""
    out: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?", text):
        prefix, inner = m.group(1), m.group(2)
        if not inner:
            out.append(prefix)
            continue
        for part in inner.split(","):
            if "-" in part:
                lo, hi = part.split("-", 1)
                if lo.isdigit() and hi.isdigit():
                    out.extend(f"{prefix}{n:0{len(lo)}d}" for n in range(int(lo), int(hi) + 1))
                else:
                    out.extend(f"{prefix}{chr(c)}" for c in range(ord(lo), ord(hi) + 1))
            else:
                out.append(f"{prefix}{part}")
    return [n for n in out if n]


def our_state(state: str, flags: list[str]) -> str:
    flags = [f.upper() for f in flags]
    s = state.lower()
    if s in ("down", "fail", "future", "unknown") or "FAIL" in flags:
        return Node.State.UNHEALTHY
    if "DRAIN" in flags or s in ("drain", "draining", "drained"):
        return (
            Node.State.DRAINING if s in ("mixed", "allocated", "draining") else Node.State.CORDONED
        )
    return Node.State.READY


def slurm_state_words(n: dict[str, Any]) -> str:
    flags = [f.lower() for f in n.get("state_flags") or []]
    return "+".join([str(n.get("state", "")).lower(), *flags])


def mirror_name(pool: Pool, name: str) -> str:
    return f"{pool.name}.{name}"[:63]


def sync_nodes(pool: Pool) -> list[Node]:
    """Read Slurm's nodes and write them as Node/Gpu rows of the pool."""
    cfg = pool.slurm
    records = cluster_for(pool).nodes()
    by_type = {str(v): k for k, v in cfg.gpu_types.items()}
    models = {m.name: m for m in GpuModel.objects.filter(name__in=list(cfg.gpu_types))}
    out = []
    with transaction.atomic():
        for n in records:
            gres = parse_gres(n.get("gres", ""))
            used = parse_gres(n.get("gres_used", ""))
            labels = {
                "slurm_cluster": cfg.cluster_name,
                "slurm_name": n["name"],
                "slurm_state": slurm_state_words(n),
                "slurm_reason": n.get("reason") or "",
                "slurm_reason_by": n.get("reason_set_by_user") or "",
                "gres": n.get("gres", ""),
                "gpus_total": sum(c for _, c in gres),
                "gpus_alloc": sum(c for _, c in used),
                "partitions": ",".join(n.get("partitions") or []),
            }
            node, _ = Node.objects.update_or_create(
                name=mirror_name(pool, n["name"]),
                defaults={
                    "pool": pool,
                    "provider": Node.Provider.SLURM,
                    "state": our_state(n.get("state", ""), n.get("state_flags") or []),
                    "labels": labels,
                    "cpu_milli": int(n.get("cpus") or 0) * 1000,
                    "memory_mib": int(n.get("real_memory") or 0),
                },
            )
            index = 0
            for kind, count in gres:
                model = models.get(by_type.get(kind, ""))
                if model is None:
                    index += count
                    continue
                for _ in range(count):
                    Gpu.objects.update_or_create(
                        uuid=f"slurm-{cfg.cluster_name}-{n['name']}-{index}"[:64],
                        defaults={
                            "node": node,
                            "index": index,
                            "model": model,
                            "memory_mib": model.memory_mib,
                        },
                    )
                    index += 1
            out.append(node)
    return out


def node_drain(
    *, actor: User, node: Node, action: str, reason: str, remote_addr: str | None = None
) -> Node:
    """Drain or resume a mirrored Slurm node: `scontrol update` with the operator and reason
    (Slurm records them as the node's reason), a NodeEvent and an audit event here."""
    if node.provider != Node.Provider.SLURM:
        raise DomainError("Only a Slurm node is drained through Slurm.", code="not_slurm")
    if action not in ("drain", "resume"):
        raise DomainError("Choose drain or resume.", code="invalid_action")
    reason = " ".join(reason.split())[:200]
    if action == "drain" and not reason:
        raise DomainError("Say why the node is drained (Slurm requires a reason).", code="reason")
    name = node.labels.get("slurm_name") or node.name
    slurm_reason = f"{reason} (by {actor.email} via the portal)" if reason else ""
    try:
        cluster_for(node.pool).scontrol_update_node(
            name, "DRAIN" if action == "drain" else "RESUME", slurm_reason
        )
    except SlurmError as exc:
        raise DomainError(f"Slurm refused: {exc}", code="slurm_error") from exc
    sync_nodes(node.pool)
    node.refresh_from_db()
    NodeEvent.objects.create(
        node=node,
        kind=f"slurm_{action}",
        message=f"{action.capitalize()} by {actor.email} through Slurm: {reason or '-'} "
        f"(Slurm now says {node.labels.get('slurm_state')})"[:500],
    )
    audit_record(
        actor=actor,
        action=f"node.slurm_{action}",
        target=node,
        data={"reason": reason, "slurm_node": name, "at": timezone.now().isoformat()},
        remote_addr=remote_addr,
    )
    return node
