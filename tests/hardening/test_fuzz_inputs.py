"""Fuzzed job manifests, job bodies and agent payloads: every one is answered with a 2xx (valid)
or a 4xx that says what is wrong, never a 5xx, and a rejected request stores nothing.

The strategies start from a valid request and replace any part of it by arbitrary JSON-like
data (strings with NUL and surrogate characters, huge numbers, nested lists and mappings), so
most examples are "almost right", which is where the half-checked paths are.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

FUZZ = settings(
    max_examples=int(os.environ.get("HARDENING_FUZZ_EXAMPLES", "40")),
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
ANN = "gpucloud.example/"


def _text(surrogates: bool) -> st.SearchStrategy[str]:
    blacklist = () if surrogates else ("Cs",)
    return st.text(st.characters(blacklist_categories=blacklist), max_size=12) | st.sampled_from(
        ["", " ", "\x00", "0", "-1", "1e400", "true", "null", "500m", "16Gi", "alpha", "H100"]
    )


def json_like(*, surrogates: bool = True) -> st.SearchStrategy[Any]:
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**70), max_value=2**70)
        | st.floats(allow_nan=False, allow_infinity=False)
        | _text(surrogates)
    )
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(_text(surrogates), inner, max_size=3)
        ),
        max_leaves=8,
    )


def maybe(valid: Any, *, surrogates: bool = True) -> st.SearchStrategy[Any]:
    """Mostly the valid value, sometimes anything."""
    valid_s = valid if isinstance(valid, st.SearchStrategy) else st.just(valid)
    return st.one_of(valid_s, valid_s, json_like(surrogates=surrogates))


def _manifests() -> st.SearchStrategy[Any]:
    any_ = json_like(surrogates=False)

    def m(v: Any) -> st.SearchStrategy[Any]:
        return maybe(v, surrogates=False)

    container = st.fixed_dictionaries(
        {"name": m("main"), "command": m(st.lists(_text(False), min_size=1, max_size=3))},
        optional={
            "args": m(st.lists(_text(False), max_size=2)),
            "image": any_,
            "workingDir": any_,
            "env": m(
                st.lists(
                    st.fixed_dictionaries(
                        {"name": m("K"), "value": any_}, optional={"valueFrom": any_}
                    ),
                    max_size=2,
                )
            ),
            "resources": m(
                st.fixed_dictionaries(
                    {
                        "limits": m(
                            st.fixed_dictionaries(
                                {"nvidia.com/gpu": m(st.integers(1, 2))},
                                optional={
                                    "cpu": m("500m"),
                                    "memory": m("16Gi"),
                                    "nvidia.com/gpu.model": m("H100-80GB-SXM"),
                                },
                            )
                        )
                    },
                    optional={"requests": any_},
                )
            ),
        },
    )
    pod = st.fixed_dictionaries(
        {"containers": m(st.lists(container, min_size=1, max_size=2))},
        optional={"nodeSelector": m({"nvidia.com/gpu.product": "NVIDIA H100 80GB HBM3"})},
    )
    spec = st.fixed_dictionaries(
        {"template": m(st.fixed_dictionaries({"spec": m(pod)}))},
        optional={
            "backoffLimit": m(st.integers(0, 3)),
            "completions": m(st.integers(1, 3)),
            "completionMode": m("Indexed"),
            "activeDeadlineSeconds": m(st.integers(1, 3600)),
        },
    )
    annotations = st.dictionaries(
        st.sampled_from(
            [f"{ANN}priority", f"{ANN}runtime-estimate-seconds", f"{ANN}preemptible", "x"]
        ),
        m("normal"),
        max_size=3,
    )
    metadata = st.fixed_dictionaries(
        {"name": m("fuzz"), "namespace": m("alpha")}, optional={"annotations": m(annotations)}
    )
    return m(
        st.fixed_dictionaries(
            {
                "apiVersion": m("batch/v1"),
                "kind": m("Job"),
                "metadata": m(metadata),
                "spec": m(spec),
            }
        )
    )


def _job_bodies() -> st.SearchStrategy[Any]:
    valid = {
        "project": "alpha",
        "name": "fuzz",
        "command": "true",
        "gpus": 1,
        "gpu_milli": 1000,
        "gpu_model": "H100-80GB-SXM",
        "precisions": ["bf16"],
        "env": {"A": "b"},
        "priority": "normal",
        "nodes": None,
        "gpus_per_node": None,
        "elastic_min": None,
        "elastic_max": None,
        "shard_count": 1,
        "runtime_estimate_s": 60,
        "cpu_milli": 1000,
        "memory_mib": 1024,
        "checkpoint": "",
    }
    fields = {k: maybe(v) for k, v in valid.items()}
    keys = list(valid)
    return st.builds(
        lambda base, drop, extra: {k: v for k, v in base.items() if k not in drop} | extra,
        st.fixed_dictionaries(fields),
        st.sets(st.sampled_from(keys), max_size=3),
        st.dictionaries(_text(True), json_like(), max_size=1),
    )


def counts() -> dict[str, int]:
    from scheduler.models import Allocation, Gpu, Job, JobEvent, LogChunk

    return {m.__name__: m.objects.count() for m in (Job, JobEvent, Allocation, LogChunk, Gpu)}


def gpu_state() -> list[tuple[Any, ...]]:
    from scheduler.models import Gpu

    return list(Gpu.objects.order_by("pk").values_list("pk", "uuid", "model_id", "memory_mib"))


def assert_answered(response: Any, before: dict[str, int], *, what: str) -> None:
    status = response.status_code
    assert status < 500, f"{what}: {status} {response.content[:300]!r}"
    if 400 <= status < 500:
        body = response.json()
        assert body and _has_message(body), f"{what}: {status} without a message: {body!r}"
        assert counts() == before, f"{what}: rejected ({status}) but rows changed"


def _has_message(body: Any) -> bool:
    if isinstance(body, str):
        return bool(body.strip())
    if isinstance(body, dict):
        return any(_has_message(v) for v in body.values())
    if isinstance(body, list):
        return any(_has_message(v) for v in body)
    return False


@pytest.fixture
def member_client(team, fleet):
    client = APIClient()
    client.force_authenticate(team["member"])
    return client


@given(manifest=_manifests())
@FUZZ
def test_fuzzed_manifests_are_answered_never_crash(manifest, member_client):
    text = yaml.safe_dump(manifest, allow_unicode=True)
    before = counts()
    response = member_client.post(
        "/api/v1/jobs/manifest", data=text.encode(), content_type="application/yaml"
    )
    assert_answered(response, before, what=f"manifest {text[:400]!r}")


@given(raw=st.binary(max_size=300) | _text(True).map(lambda t: t.encode("utf-8", "replace")))
@FUZZ
def test_arbitrary_bytes_as_a_manifest(raw, member_client):
    before = counts()
    response = member_client.post("/api/v1/jobs/manifest", data=raw, content_type="text/yaml")
    assert_answered(response, before, what=f"raw {raw[:200]!r}")


@given(body=_job_bodies())
@FUZZ
def test_fuzzed_job_bodies_are_answered_never_crash(body, member_client):
    before = counts()
    payload = json.dumps(body)
    for path in ("/api/v1/jobs", "/api/v1/jobs/dry-run"):
        response = member_client.post(path, data=payload, content_type="application/json")
        if path.endswith("dry-run"):
            assert counts() == before, "a dry run stored something"
        assert_answered(response, before, what=f"POST {path} {payload[:400]}")
        before = counts()


# --- agent endpoints ----------------------------------------------------------------------


@pytest.fixture
def placed(team, fleet):
    """A job placed on a node by a real cycle; that node's agent client."""
    from scheduler.admission import JobSpec, job_submit
    from scheduler.cycle import run_cycle
    from scheduler.models import Allocation

    job = job_submit(
        actor=team["member"],
        project=team["a"],
        spec=JobSpec(name="fz", command="true", gpu_model=fleet["h100"]),
    )[0]
    run_cycle()
    alloc = Allocation.objects.get(job=job, ended_at__isnull=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {fleet['tokens'][alloc.node.name]}")
    return {"job": job, "client": client, "node": alloc.node}


def _gpu_item() -> st.SearchStrategy[Any]:
    return st.fixed_dictionaries(
        {
            "index": maybe(st.integers(0, 3)),
            "uuid": maybe(st.sampled_from(["GPU-aaaa-1", "GPU-bbbb-2", "GPU-cccc-3"])),
            "name": maybe(st.sampled_from(["NVIDIA H100 80GB HBM3", "NVIDIA L4"])),
            "memory_mib": maybe(st.integers(1, 81920)),
        },
        optional={"mig_mode": maybe(False)},
    )


AGENT_BODIES: dict[str, st.SearchStrategy[Any]] = {
    "register": st.fixed_dictionaries(
        {"hostname": maybe("h1"), "gpus": maybe(st.lists(_gpu_item(), max_size=3))},
        optional={
            "simulated": maybe(True),
            "driver_version": maybe("550.1"),
            "cuda_version": maybe("12.4"),
            "cpu_milli": maybe(64000),
            "memory_mib": maybe(512000),
        },
    ),
    "heartbeat": st.fixed_dictionaries(
        {
            "telemetry": maybe(
                st.lists(
                    st.fixed_dictionaries(
                        {"uuid": maybe("GPU-aaaa-1")},
                        optional={
                            "utilization": maybe(50.0),
                            "memory_used_mib": maybe(100),
                            "temperature_c": maybe(60.0),
                            "ecc_uncorrected": maybe(0),
                            "xid_events": maybe([79]),
                            "processes": maybe([{"pid": 1}]),
                            "lost": maybe(False),
                        },
                    ),
                    max_size=2,
                )
            ),
            "running": maybe(
                st.lists(
                    st.fixed_dictionaries({"job_id": maybe(1), "attempt": maybe(1)}), max_size=2
                )
            ),
        }
    ),
    "started": st.fixed_dictionaries({"attempt": maybe(1)}, optional={"pid": maybe(42)}),
    "exited": st.fixed_dictionaries(
        {
            "attempt": maybe(1),
            "exit_code": maybe(st.integers(-1, 2)),
            "reason": maybe(st.sampled_from(["exited", "killed", "failed_to_start"])),
        },
        optional={"signal": maybe(9), "message": maybe("bye")},
    ),
    "logs": st.fixed_dictionaries(
        {
            "attempt": maybe(1),
            "seq": maybe(st.integers(0, 3)),
            "stream": maybe("stdout"),
            "text": maybe(_text(True)),
        }
    ),
}


@given(
    endpoint=st.sampled_from(sorted(AGENT_BODIES)),
    data=st.data(),
    raw=st.booleans(),
    job_choice=st.sampled_from(["mine", "missing", "huge"]),
)
@FUZZ
def test_fuzzed_agent_payloads_are_answered_never_crash(endpoint, data, raw, job_choice, placed):
    body = data.draw(AGENT_BODIES[endpoint] if not raw else json_like())
    job_id = {"mine": placed["job"].pk, "missing": 999_999, "huge": 2**31 + 7}[job_choice]
    path = (
        f"/api/agent/v1/{endpoint}"
        if endpoint in ("register", "heartbeat")
        else f"/api/agent/v1/jobs/{job_id}/{endpoint}"
    )
    before, gpus = counts(), gpu_state()
    response = placed["client"].post(path, data=json.dumps(body), content_type="application/json")
    assert_answered(response, before, what=f"POST {path} {json.dumps(body)[:400]}")
    if response.status_code >= 400:
        assert gpu_state() == gpus, "a refused registration changed the node's GPUs"
