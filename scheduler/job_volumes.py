"""A job's volumes, its checkpoint and its working directory: container paths only (issue 27).

A job request names its project's volumes by name and says where each is mounted *inside the
container*; its checkpoint is "<volume>:<relative path>"; its working directory is a directory
in the container. No field ever names a host path: the agent derives every host path from its
own configuration and the volume's id (docs/storage.md).

`mounts_validate` is the syntax (no database: every surface's spec goes through it),
`volumes_resolve` checks the names against the project's live volumes (at submit), and
`assignment_volumes` is what an agent is sent.
"""

from __future__ import annotations

import itertools
import posixpath
import re
from collections.abc import Iterable, Mapping
from typing import Any, cast

from agent.protocol import VolumeMount
from portal.errors import DomainError
from storage.paths import container_path_validate

WORKSPACE = "/workspace"  # the job's own scratch workspace in the container (agent/protocol.py)
MAX_VOLUMES = 16
MAX_SCRATCH_GIB = 10_000
DEFAULT_SCRATCH_GIB = 10
MAX_CHECKPOINT = 600
VOLUME_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
MIB_PER_GIB = 1024


def default_mount_path(name: str) -> str:
    return f"/data/{name}"


def _below(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _mount(item: Any, i: int) -> dict[str, Any]:
    """One entry of `volumes`, normalised: {name, path, read_only} (+ kind, size_gib: scratch)."""
    if not isinstance(item, Mapping):
        raise DomainError(f"volumes[{i}]: give an object with a name.", field="volumes")
    unknown = sorted(set(item) - {"name", "path", "read_only", "kind", "size_gib"})
    if unknown:
        raise DomainError(
            f"volumes[{i}]: unknown key {', '.join(unknown)} (name, path, read_only; "
            "kind and size_gib for scratch).",
            field="volumes",
        )
    name = item.get("name")
    if not isinstance(name, str) or not VOLUME_NAME.match(name):
        raise DomainError(
            f"volumes[{i}]: {name!r} is not a volume name (lowercase letters, digits, hyphens).",
            field="volumes",
        )
    path = item.get("path") or default_mount_path(name)
    if not isinstance(path, str):
        raise DomainError(f"volumes[{i}]: the path is a string.", field="volumes")
    path = container_path_validate(path, field="volumes")
    if _below(path, WORKSPACE) or _below(WORKSPACE, path):
        raise DomainError(
            f"volumes[{i}]: {path} overlaps the job's workspace {WORKSPACE}; mount it elsewhere "
            f"(e.g. {default_mount_path(name)}).",
            field="volumes",
        )
    read_only = item.get("read_only", False)
    if not isinstance(read_only, bool):
        raise DomainError(f"volumes[{i}]: read_only is true or false.", field="volumes")
    out: dict[str, Any] = {"name": name, "path": path, "read_only": read_only}
    kind = item.get("kind") or ""
    if kind not in ("", "scratch"):
        raise DomainError(
            f"volumes[{i}]: kind is 'scratch' or left out (the project's volume of that name).",
            field="volumes",
        )
    if kind == "scratch":
        size = item.get("size_gib", DEFAULT_SCRATCH_GIB)
        if type(size) is not int or not 1 <= size <= MAX_SCRATCH_GIB:
            raise DomainError(
                f"volumes[{i}]: a scratch volume's size_gib is 1 to {MAX_SCRATCH_GIB}.",
                field="volumes",
            )
        out |= {"kind": "scratch", "size_gib": size}
    elif "size_gib" in item:
        raise DomainError(
            f"volumes[{i}]: size_gib is for scratch; a project volume has its own size.",
            field="volumes",
        )
    return out


def _checkpoint_place(checkpoint: str) -> tuple[str, str]:
    """'<volume>:<relative path>' → (volume, normal relative path); a host path is refused."""
    volume, sep, rel = checkpoint.partition(":")
    if checkpoint.startswith("/") or not sep or not VOLUME_NAME.match(volume):
        raise DomainError(
            f"{checkpoint!r}: a checkpoint is a volume and a path inside it, e.g. 'ckpt:runs/a'; "
            "a host path is never accepted.",
            field="checkpoint",
        )
    normal = posixpath.normpath(rel) if rel else ""
    if rel.startswith("/") or "\x00" in rel or ".." in rel.split("/"):
        raise DomainError(
            f"{rel!r}: give a relative path inside volume {volume}, without '..'.",
            field="checkpoint",
        )
    return volume, "" if normal == "." else normal


def mounts_validate(
    volumes: Iterable[Any], checkpoint: str, working_dir: str
) -> tuple[tuple[dict[str, Any], ...], str, str]:
    """The normalised volumes, checkpoint and working directory, or a DomainError naming the
    field. A checkpoint's volume that is not mounted is mounted read-write at /data/<name>."""
    mounts = [_mount(item, i) for i, item in enumerate(volumes)]
    if len(mounts) > MAX_VOLUMES:
        raise DomainError(f"At most {MAX_VOLUMES} volumes per job.", field="volumes")
    by_name: dict[str, dict[str, Any]] = {}
    for m in mounts:
        if m["name"] in by_name:
            raise DomainError(f"Volume {m['name']} is mounted twice.", field="volumes")
        by_name[m["name"]] = m
    if checkpoint:
        if len(checkpoint) > MAX_CHECKPOINT:
            raise DomainError(f"At most {MAX_CHECKPOINT} characters.", field="checkpoint")
        volume, rel = _checkpoint_place(checkpoint)
        if volume not in by_name:
            mounts.append({"name": volume, "path": default_mount_path(volume), "read_only": False})
            by_name[volume] = mounts[-1]
        m = by_name[volume]
        if m["read_only"]:
            raise DomainError(
                f"Volume {volume} is mounted read-only; a checkpoint needs it read-write.",
                field="checkpoint",
            )
        if m.get("kind") == "scratch":
            raise DomainError(
                f"Volume {volume} is scratch (removed when the job ends): keep checkpoints on a "
                "node-local or shared volume.",
                field="checkpoint",
            )
        checkpoint = f"{volume}:{rel}"
    paths = sorted(m["path"] for m in mounts)
    for a, b in itertools.combinations(paths, 2):
        if _below(b, a) or _below(a, b):
            raise DomainError(
                f"Two volumes are mounted at {a} and {b}: give each its own path.",
                field="volumes",
            )
    return tuple(mounts), checkpoint, _working_dir(working_dir, paths)


def _working_dir(working_dir: str, mount_paths: list[str]) -> str:
    """The working directory in the container: the workspace or below, or in a volume."""
    if not working_dir:
        return ""
    if not working_dir.startswith("/"):
        raise DomainError(
            f"{working_dir!r}: give an absolute path in the container (default {WORKSPACE}).",
            field="working_dir",
        )
    path = container_path_validate(working_dir, field="working_dir")
    if not any(_below(path, root) for root in [WORKSPACE, *mount_paths]):
        raise DomainError(
            f"{path} is not in the job's container workspace ({WORKSPACE}) or one of its "
            "volumes; the working directory is a path inside the container, never a host path.",
            field="working_dir",
        )
    return path


def checkpoint_split(checkpoint: str) -> tuple[str, str] | None:
    """A stored checkpoint's (volume, relative path), or None."""
    if not checkpoint:
        return None
    volume, _, rel = checkpoint.partition(":")
    return volume, rel


def checkpoint_container_path(volumes: Iterable[Mapping[str, Any]], checkpoint: str) -> str:
    """Where CHECKPOINT_DIR points in the container ("" without a checkpoint)."""
    place = checkpoint_split(checkpoint)
    if place is None:
        return ""
    for m in volumes:
        if m["name"] == place[0]:
            return posixpath.join(m["path"], place[1]) if place[1] else str(m["path"])
    return ""


def volume_mount_text(m: Mapping[str, Any]) -> str:
    """The CLI's and the form's 'name:/path[:ro]' of one mount."""
    text = f"{m['name']}:{m['path']}"
    if m.get("kind") == "scratch":
        text += f":scratch={m.get('size_gib', DEFAULT_SCRATCH_GIB)}"
    return text + (":ro" if m.get("read_only") else "")


def volume_mount_parse(text: str, *, field: str = "volumes") -> dict[str, Any]:
    """'name[:/path][:ro][:scratch=GiB]' → a `volumes` entry (validated later)."""
    name, *rest = text.strip().split(":")
    out: dict[str, Any] = {"name": name}
    for part in rest:
        if part.startswith("/"):
            out["path"] = part
        elif part in ("ro", "rw"):
            out["read_only"] = part == "ro"
        elif part.startswith("scratch"):
            _, _, size = part.partition("=")
            out["kind"] = "scratch"
            if size:
                if not size.isdigit():
                    raise DomainError(f"{text!r}: scratch=<GiB>, e.g. scratch=20.", field=field)
                out["size_gib"] = int(size)
        else:
            raise DomainError(
                f"{text!r}: write name:/path in the container, then :ro for read-only.",
                field=field,
            )
    return out


def volumes_resolve(*, project: Any, volumes: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The project's live volumes a job mounts, by name; a 400 naming `volumes` for a name
    the project has no live volume of (another project's is never found), one being deleted,
    a dataset mounted read-write or not filled yet."""
    from storage.models import FillState, Volume, VolumeState

    wanted = [m for m in volumes if m.get("kind") != "scratch"]
    if not wanted:
        return {}
    rows = {
        v.name: v
        for v in Volume.objects.filter(
            project=project,
            name__in=[m["name"] for m in wanted],
            state__in=(VolumeState.ACTIVE, VolumeState.DELETING),
        )
    }
    for m in wanted:
        v = rows.get(m["name"])
        if v is None:
            raise DomainError(
                f"Project {project.slug} has no volume named {m['name']!r} (deleted, or never "
                "created): create it first (gpucloud volume create).",
                field="volumes",
            )
        if v.state != VolumeState.ACTIVE:
            raise DomainError(f"Volume {v.name} is being deleted.", field="volumes")
        if v.is_dataset and not m.get("read_only"):
            raise DomainError(
                f"Volume {v.name} is a dataset: mount it read-only (read_only: true, or :ro).",
                field="volumes",
            )
        if v.is_dataset and v.fill_state != FillState.READY:
            raise DomainError(
                f"Dataset {v.name} is not complete yet ({v.fill_state}).", field="volumes"
            )
    nodes = {v.node_name: v.name for v in rows.values() if v.node_name}
    if len(nodes) > 1:
        raise DomainError(
            "Node-local volumes "
            + ", ".join(f"{name} (on {node})" for node, name in sorted(nodes.items()))
            + " are on different nodes: a job runs on one node.",
            field="volumes",
        )
    return rows


def assignment_volumes(
    volumes: Iterable[Mapping[str, Any]], rows: Mapping[str, Any]
) -> list[VolumeMount]:
    """The assignment's `volumes` (agent/protocol.py VolumeMount): ids, kinds, container paths
    and limits, never a host path. A project volume no longer live is left out."""
    out: list[VolumeMount] = []
    for m in volumes:
        if m.get("kind") == "scratch":
            out.append(
                {
                    "id": 0,
                    "name": m["name"],
                    "kind": "scratch",
                    "mount_path": m["path"],
                    "read_only": bool(m.get("read_only")),
                    "limit_mib": int(m.get("size_gib") or DEFAULT_SCRATCH_GIB) * MIB_PER_GIB,
                }
            )
            continue
        v = rows.get(m["name"])
        if v is None:
            continue
        out.append(
            {
                "id": v.pk,
                "name": v.name,
                "kind": cast(Any, v.kind),  # one of VOLUME_KINDS (the model's choices)
                "mount_path": m["path"],
                "read_only": bool(m.get("read_only")) or v.is_dataset,
                "limit_mib": v.size_gib * MIB_PER_GIB,
            }
        )
    return out
