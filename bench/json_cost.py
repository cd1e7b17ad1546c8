"""CPU per JSON parse and render: DRF's JSON classes against `foundation.fastjson`'s (orjson).

    .venv/bin/python -m bench.json_cost [--rounds 41] [--calls 200]

The bodies are the ones the web workers see most: a heartbeat as the agents send it (8 GPUs ×
10 samples, `bench.agent_requests.heartbeat_body`), its answer, a job's answer as
`JobSerializer` gives it, and a page of 50 of them. Each round times `--calls` calls of one
class, then of the other (thread CPU time); the table gives the medians over the rounds of the
CPU per call. No database: parsers and renderers only.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import io
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench import command_line, markdown_table, spread, write_section


def job_answer(i: int) -> dict[str, Any]:
    """What `JobSerializer` gives for a queued one-GPU job (its `pending` keeps a datetime, which
    the renderer's encoder formats)."""
    at = "2026-12-02T04:05:06.123456Z"
    return {
        "id": 100_000 + i,
        "name": f"train-resnet-{i}",
        "project": "vision-lab",
        "state": "queued",
        "source": "api",
        "submitted_by": "alice@example.org",
        "command": "python train.py --epochs 90 --batch-size 256 --lr 0.1",
        "image": "nvcr.io/nvidia/pytorch:24.08-py3",
        "image_digest": "",
        "gpus": 1,
        "gpu_milli": 1000,
        "gpu_memory_mib": None,
        "gpu_model": "H100-80GB-SXM",
        "gpu_models": [],
        "min_gpu_memory_gb": None,
        "precisions": ["bf16", "fp16"],
        "nodes": 1,
        "gpus_per_node": None,
        "cpu_milli": 8000,
        "memory_mib": 65536,
        "shm_mib": 8192,
        "priority": "normal",
        "preemptible": False,
        "borrowed": False,
        "runtime_estimate_s": 3600,
        "time_limit_s": 86400,
        "checkpoint_dir": "/checkpoints/resnet",
        "max_restarts": 3,
        "restarts": 0,
        "elastic_min": None,
        "elastic_max": None,
        "shard_index": None,
        "shard_count": None,
        "array_parent": None,
        "attempt": 0,
        "pending": {
            "reason": "waiting_in_queue",
            "message": "Waiting for the next scheduling cycle.",
            "queue_position": 12,
            "estimated_start": datetime.datetime(2026, 12, 2, 4, 6, 7, 891000, tzinfo=datetime.UTC),
        },
        "exit_code": None,
        "failure_reason": "",
        "created_at": at,
        "queued_at": at,
        "started_at": None,
        "finished_at": None,
        "manifest_ignored": [],
    }


def per_call_us(call: Callable[[], Any], calls: int) -> float:
    started = time.thread_time_ns()
    for _ in range(calls):
        call()
    return (time.thread_time_ns() - started) / calls / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--no-docs", action="store_true", help="only print the table")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")
    import django

    django.setup()
    import orjson
    from rest_framework import parsers, renderers, serializers
    from rest_framework.utils.serializer_helpers import ReturnDict, ReturnList

    from bench.agent_requests import heartbeat_body
    from foundation import fastjson
    from portal.api.schema import StrictJSONParser

    serializer: serializers.Serializer[Any] = (
        serializers.Serializer()
    )  # ReturnDict's and ReturnList's owner
    uuids = [f"GPU-{i:08x}-1111-2222-3333-444455556666" for i in range(8)]
    heartbeat = orjson.dumps(heartbeat_body(uuids, samples_per_gpu=10))
    page = {
        "count": 400,
        "next": "http://testserver/api/v1/jobs/?limit=50&offset=50",
        "previous": None,
        "results": ReturnList(
            [ReturnDict(job_answer(i), serializer=serializer) for i in range(50)],
            serializer=serializer,
        ),
    }

    class DrfStrict(StrictJSONParser):
        """StrictJSONParser as it was: DRF's parser, then the surrogate check."""

        def parse_bytes(self, raw: bytes, media_type: Any = None, context: Any = None) -> Any:
            return parsers.JSONParser.parse(self, io.BytesIO(raw), media_type, context), False

    context = {"encoding": "utf-8"}
    cases: list[tuple[str, str, Callable[[], Any], Callable[[], Any]]] = [
        (
            "parse",
            f"heartbeat, {len(heartbeat):,} bytes (StrictJSONParser)",
            lambda: DrfStrict().parse(io.BytesIO(heartbeat), None, context),
            lambda: StrictJSONParser().parse(io.BytesIO(heartbeat), None, context),
        ),
        (
            "parse",
            f"heartbeat, {len(heartbeat):,} bytes (JSONParser)",
            lambda: parsers.JSONParser().parse(io.BytesIO(heartbeat), None, context),
            lambda: fastjson.JSONParser().parse(io.BytesIO(heartbeat), None, context),
        ),
    ]
    for what, data in [
        (
            "heartbeat answer",
            {"ok": True, "fenced": False, "images": ["nvcr.io/nvidia/pytorch:24.08-py3"]},
        ),
        ("job answer", ReturnDict(job_answer(0), serializer=serializer)),
        ("page of 50 jobs", page),
    ]:
        size = len(renderers.JSONRenderer().render(data))
        cases.append(
            (
                "render",
                f"{what}, {size:,} bytes",
                functools.partial(renderers.JSONRenderer().render, data, "application/json", {}),
                functools.partial(fastjson.JSONRenderer().render, data, "application/json", {}),
            )
        )
    rows = []
    for kind, what, drf, ours in cases:
        assert repr(drf()) == repr(ours()), what  # the same answer, or there is nothing to time
        calls = max(1, args.calls // 10) if "page" in what else args.calls
        before, after = [], []
        for _ in range(args.rounds):
            before.append(per_call_us(drf, calls))
            after.append(per_call_us(ours, calls))
        ratio = statistics.median(before) / statistics.median(after)
        rows.append([kind, what, spread(before), spread(after), f"{ratio:.1f}"])
    table = markdown_table(
        ["", "body", "DRF µs per call, median (min–max)", "orjson µs", "DRF / orjson"], rows
    )
    print(table)
    if not args.no_docs:
        write_section(
            "json_cost",
            "## JSON parse and render: DRF's classes against foundation.fastjson (orjson)\n\n"
            f"`{command_line('bench.json_cost')}` — thread CPU time per call, the two ways "
            f"alternating, medians over {args.rounds} rounds.\n\n" + table,
        )


if __name__ == "__main__":
    main()
