"""`gpucloud volume create|ls|rm|upload`: a project's volumes and datasets.

An upload is resumable: the portal reports how many bytes it has (`offset`), the CLI sends the
rest in chunks from there, so running the same upload again after a break continues where it
stopped. Progress goes to standard error.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpucloud_cli import output
from gpucloud_cli.client import Api, ApiError

CHUNK_BYTES = 8 * 2**20
MAX_RETRIES = 8


def _base(project: str) -> str:
    return f"/api/v1/projects/{project}/volumes"


def cmd_create(args: argparse.Namespace, api: Api, project: str) -> int:
    body: dict[str, Any] = {"name": args.name, "kind": args.kind, "size_gib": args.size}
    if args.dataset:
        body["is_dataset"] = True
    if args.node:
        body["node_name"] = args.node
    if args.from_url:
        body["source_url"] = args.from_url
        body["is_dataset"] = True
    volume = api.post(_base(project), body)
    if args.json:
        output.emit_json(volume)
        return 0
    what = "Dataset" if volume["is_dataset"] else "Volume"
    print(
        f"{what} {volume['name']} created in {project} ({volume['size_gib']} GiB, {volume['kind']})."
    )
    if volume["fill_state"] == "importing":
        print(f"Importing from {volume['source_url']}; see `gpucloud volume ls`.")
    return 0


def cmd_ls(args: argparse.Namespace, api: Api, project: str) -> int:
    volumes = api.get(_base(project), {"limit": 1000}).get("results", [])
    if args.json:
        output.emit_json(volumes)
        return 0
    output.table(
        ["NAME", "KIND", "SIZE_GIB", "DATASET", "CONTENT", "NODE", "SHA256"],
        [
            (
                v["name"],
                v["kind"],
                v["size_gib"],
                v["is_dataset"],
                _content(v),
                v["node_name"],
                v["sha256"][:16] if v["sha256"] else "",
            )
            for v in volumes
        ],
    )
    return 0


def _content(volume: dict[str, Any]) -> str:
    if not volume["is_dataset"]:
        return f"{volume['used_bytes']} B used"
    state = str(volume["fill_state"])
    if state in ("uploading", "importing"):
        return f"{state} {volume['progress_percent']}%"
    return state


def cmd_rm(args: argparse.Namespace, api: Api, project: str) -> int:
    api.delete(f"{_base(project)}/{args.name}")
    if args.json:
        output.emit_json({"deleted": args.name})
    else:
        print(f"Volume {args.name} deleted from {project}.")
    return 0


def cmd_upload(args: argparse.Namespace, api: Api, project: str) -> int:
    path = Path(args.file)
    try:
        size = path.stat().st_size
        handle = path.open("rb")
    except OSError as exc:
        raise ApiError(f"Cannot read {args.file}: {exc.strerror}.", exit_code=2) from exc
    url = f"{_base(project)}/{args.name}/upload"
    with handle:
        status = api.post(url, {"file_name": path.name, "size_bytes": size})
        if status["offset"]:
            print(f"Resuming at byte {status['offset']} of {size}.", file=sys.stderr)
        status = _send(api, url, handle, size, status, chunk=args.chunk_mib * 2**20)
    if args.json:
        output.emit_json(status)
    else:
        print(
            f"Uploaded {path.name} to dataset {args.name}: {size} bytes, sha256 {status['sha256']}."
        )
    return 0


def _send(
    api: Api, url: str, handle: Any, size: int, status: dict[str, Any], *, chunk: int
) -> dict[str, Any]:
    """Chunks from the offset the portal reports; after a refusal of the offset (409) or a
    lost connection, ask where it stands and go on from there."""
    retries = 0
    progress = _progress(size)
    while status["offset"] < size:
        offset = int(status["offset"])
        progress(offset)
        handle.seek(offset)
        data = handle.read(chunk)
        try:
            status = api.patch_bytes(url, data, headers={"Upload-Offset": str(offset)})
            retries = 0
        except ApiError as exc:
            if exc.status not in (409, 502, 503, 504) and exc.exit_code != 3:
                raise
            retries += 1
            if retries > MAX_RETRIES:
                raise
            time.sleep(min(30.0, 0.5 * 2**retries))
            status = api.get(url)
            if status["state"] != "uploading":
                raise ApiError(
                    f"The upload cannot go on: the dataset is {status['state']}."
                ) from exc
    progress(size)
    print(file=sys.stderr)
    return status


def _progress(total: int) -> Callable[[int], None]:
    def show(done: int) -> None:
        percent = done * 100 // total if total else 100
        print(f"\r{percent:3d}%  {done}/{total} bytes", end="", file=sys.stderr, flush=True)

    return show


COMMANDS: list[tuple[str, Callable[[argparse.Namespace, Api, str], int], str]] = [
    ("create", cmd_create, "create a volume or a dataset (within the project's storage quota)"),
    ("ls", cmd_ls, "list the project's volumes"),
    ("rm", cmd_rm, "delete a volume (not while an active job mounts it)"),
    ("upload", cmd_upload, "upload a file into a dataset (resumable: run it again to continue)"),
]


def add_parser(
    sub: Any,
    common: argparse.ArgumentParser,
    run: Callable[[Callable[[argparse.Namespace, Api, str], int]], Callable[..., int]],
) -> None:
    """`volume` and its subcommands; `run` wraps each with the API and the project."""
    volume = sub.add_parser("volume", help="a project's volumes and datasets")
    inner = volume.add_subparsers(dest="volume_command", required=True, metavar="ACTION")
    for name, func, help_text in COMMANDS:
        p = inner.add_parser(name, parents=[common], help=help_text, description=help_text)
        p.set_defaults(func=run(func))
        p.add_argument("--project", help="project slug (default: your only project)")
        if name != "ls":
            p.add_argument("name", help="the volume's name")
        if name == "create":
            p.add_argument("--size", type=int, required=True, help="size limit in GiB")
            p.add_argument("--kind", choices=["scratch", "node_local", "shared"], default="shared")
            p.add_argument("--dataset", action="store_true", help="a read-only dataset")
            p.add_argument("--node", help="node-local: the node to keep it on")
            p.add_argument("--from-url", help="a dataset imported from this http(s) URL")
        if name == "upload":
            p.add_argument("file", help="the file to upload")
            p.add_argument("--chunk-mib", type=int, default=CHUNK_BYTES // 2**20)
