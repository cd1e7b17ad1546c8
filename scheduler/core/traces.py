"""Readers for the trace formats the simulators accept, with plain error messages.

- Alibaba GPU v2023 ("openb") node lists: ``sn,cpu_milli,memory_mib,gpu,model``
- Alibaba pod lists: ``name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...]``
- Philly jobs: ``timestamp,duration,num_gpus[,gpu_time,cluster]`` (timestamp as
  ``YYYY-MM-DD HH:MM:SS`` or seconds)
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path


class TraceError(Exception):
    """A trace file is missing or malformed; the message says where and why."""


@dataclass(frozen=True, slots=True)
class NodeRow:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class PodRow:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: frozenset[str]


@dataclass(frozen=True, slots=True)
class JobRow:
    submit_s: float
    duration_s: float
    gpus: int
    cluster: str


def _rows(path: str | Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"{p}: no such file")
    try:
        fh = p.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"{p}: cannot open ({exc.strerror})") from None
    with fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceError(
                f"{p}: missing column(s) {', '.join(missing)}; "
                f"expected {', '.join(required)} (found {', '.join(header) or 'no header'})"
            )
        try:
            yield from enumerate(reader, start=2)
        except (csv.Error, UnicodeDecodeError) as exc:
            raise TraceError(f"{p}: not a readable CSV file ({exc})") from None


def _int(path: str | Path, line: int, row: dict[str, str], col: str, lo: int = 0) -> int:
    raw = (row.get(col) or "").strip()
    try:
        val = int(float(raw))
    except ValueError:
        raise TraceError(f"{path}:{line}: column {col} is {raw!r}, not a number") from None
    if val < lo:
        raise TraceError(f"{path}:{line}: column {col} is {val}, must be at least {lo}")
    return val


def read_nodes(path: str | Path) -> list[NodeRow]:
    out: list[NodeRow] = []
    for line, row in _rows(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model")):
        gpus = _int(path, line, row, "gpu")
        model = (row.get("model") or "").strip()
        if gpus > 0 and model in ("", "nan"):
            raise TraceError(f"{path}:{line}: node has {gpus} GPUs but no model")
        out.append(
            NodeRow(
                name=row["sn"],
                cpu_milli=_int(path, line, row, "cpu_milli"),
                memory_mib=_int(path, line, row, "memory_mib"),
                gpus=gpus,
                model=model if gpus > 0 else "",
            )
        )
    if not out:
        raise TraceError(f"{path}: no nodes")
    return out


def read_pods(path: str | Path) -> list[PodRow]:
    out: list[PodRow] = []
    for line, row in _rows(path, ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")):
        num = _int(path, line, row, "num_gpu")
        milli = _int(path, line, row, "gpu_milli")
        if num > 1 or (num == 1 and milli <= 0):
            milli = 1000
        if milli > 1000:
            raise TraceError(f"{path}:{line}: gpu_milli {milli} exceeds one GPU (1000)")
        spec = (row.get("gpu_spec") or "").strip()
        models = frozenset(m for m in spec.split("|") if m and m != "nan")
        out.append(
            PodRow(
                name=row["name"],
                cpu_milli=_int(path, line, row, "cpu_milli"),
                memory_mib=_int(path, line, row, "memory_mib"),
                num_gpu=num,
                gpu_milli=milli if num > 0 else 0,
                gpu_spec=models,
            )
        )
    if not out:
        raise TraceError(f"{path}: no pods")
    return out


def _timestamp(path: str | Path, line: int, raw: str) -> float:
    raw = raw.strip()
    try:
        return float(raw)
    except ValueError:
        pass
    try:
        return datetime.strptime(raw, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
    except ValueError:
        raise TraceError(
            f"{path}:{line}: timestamp {raw!r} is neither seconds nor YYYY-MM-DD HH:MM:SS"
        ) from None


def read_jobs(
    path: str | Path, cluster: str | None = None, limit: int | None = None
) -> list[JobRow]:
    out: list[JobRow] = []
    for line, row in _rows(path, ("timestamp", "duration", "num_gpus")):
        cl = (row.get("cluster") or "").strip()
        if cluster is not None and cl != cluster:
            continue
        dur_raw = (row.get("duration") or "").strip()
        try:
            dur = float(dur_raw)
        except ValueError:
            raise TraceError(f"{path}:{line}: duration {dur_raw!r} is not a number") from None
        if dur < 0:
            raise TraceError(f"{path}:{line}: negative duration {dur}")
        out.append(
            JobRow(
                submit_s=_timestamp(path, line, row["timestamp"]),
                duration_s=dur,
                gpus=_int(path, line, row, "num_gpus", lo=1),
                cluster=cl,
            )
        )
    if not out:
        where = f" for cluster {cluster}" if cluster is not None else ""
        raise TraceError(f"{path}: no jobs{where}")
    out.sort(key=lambda j: j.submit_s)
    if limit is not None:
        out = out[:limit]
    return out
