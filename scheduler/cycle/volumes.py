"""Node-local volumes in the cycle: a job that mounts one runs on the volume's node.

The state step pins such a job (`JobRequest.node`, with `node_why` for its pending reason:
"its volume 'ckpt' is on that node"); a job whose node-local volume has no node yet is placed
anywhere, and the apply step binds the volume to the node it was placed on, under the
volume's row lock (`volumes_bind`). A checkpoint on a node-local volume is one such mount, so
after a preemption or a node loss the job waits for that node; on a shared volume it resumes
on any node.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from scheduler.core.model import JobRequest
from scheduler.job_volumes import checkpoint_split


@dataclass
class Pins:
    """Per job: the node its node-local volumes pin it to, and the unbound volumes to bind."""

    node: dict[int, tuple[str, str]] = field(default_factory=dict)  # job → (node, why)
    unbound: dict[int, list[tuple[int, str]]] = field(default_factory=dict)  # job → [(id, name)]


def _mounts(volumes_json: str) -> list[dict[str, Any]]:
    if volumes_json in ("", "[]"):
        return []
    return [m for m in json.loads(volumes_json) if m.get("kind") != "scratch"]


def volume_pins(jobs: Iterable[tuple[int, int, str, str]]) -> Pins:
    """`jobs`: (job id, project id, volumes as JSON text, checkpoint) of queued jobs. One
    query, none when no job mounts a project volume."""
    from storage.models import Volume, VolumeKind, VolumeState

    wanted: dict[int, tuple[int, list[str], str]] = {}
    for job_id, project_id, volumes_json, checkpoint in jobs:
        names = [m["name"] for m in _mounts(volumes_json)]
        if names:
            place = checkpoint_split(checkpoint)
            wanted[job_id] = (project_id, names, place[0] if place else "")
    pins = Pins()
    if not wanted:
        return pins
    local = {
        (v.project_id, v.name): v
        for v in Volume.objects.filter(
            kind=VolumeKind.NODE_LOCAL,
            state=VolumeState.ACTIVE,
            project_id__in={p for p, _, _ in wanted.values()},
            name__in={n for _, names, _ in wanted.values() for n in names},
        ).only("pk", "project_id", "name", "node_name")
    }
    for job_id, (project_id, names, ckpt) in wanted.items():
        for name in names:
            v = local.get((project_id, name))
            if v is None:
                continue
            if not v.node_name:
                pins.unbound.setdefault(job_id, []).append((v.pk, v.name))
            elif job_id not in pins.node:
                what = "its checkpoint volume" if name == ckpt else "its volume"
                pins.node[job_id] = (v.node_name, f"{what} '{name}' is on that node")
    return pins


def pinned(requests: list[JobRequest], pins: Pins) -> list[JobRequest]:
    """The queue with each pinned job's node and why."""
    if not pins.node:
        return requests
    return [
        replace(r, node=pins.node[r.job_id][0], node_why=pins.node[r.job_id][1])
        if r.job_id in pins.node
        else r
        for r in requests
    ]


def volumes_bind(job_id: int, volumes: list[tuple[int, str]], node_names: set[str]) -> str | None:
    """Bind a placed job's unbound node-local volumes to its node (the volume rows locked).
    None: bound (or already on that node); else why the placement must wait (another job's
    placement this cycle bound it elsewhere, or a gang spans several nodes)."""
    from storage.models import Volume
    from storage.services import volume_bind_node

    if len(node_names) != 1:
        return f"its node-local volume '{volumes[0][1]}' can be on one node only"
    (node_name,) = node_names
    locked = {
        v.pk: v for v in Volume.objects.select_for_update().filter(pk__in=[pk for pk, _ in volumes])
    }
    for pk, name in volumes:
        v = locked.get(pk)
        if v is not None and v.node_name and v.node_name != node_name:
            return f"its volume '{name}' is on node {v.node_name}"
    for pk, _ in volumes:
        if pk in locked and not locked[pk].node_name:
            volume_bind_node(volume_id=pk, node_name=node_name)
    return None
