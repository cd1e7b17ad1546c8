"""The submission's plain parser agrees with JobCreateSerializer wherever it answers.

Building and running the serializer was a tenth of a submit's CPU. `SUBMIT_PARSER` parses
plainly valid submissions and leaves everything else (odd types, blanks, untrimmed strings,
out of range, unknown fields, nested dependencies) to the serializer, which explains what is
wrong with its usual messages.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework import serializers

from foundation.plainparse import PlainParser
from scheduler.api.jobs import SUBMIT_PARSER, JobCreateSerializer

pytestmark = pytest.mark.django_db

_odd = (
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.sampled_from([0, 1, 59, 60, 4096, 4097, 2**63, 1.0, 2.5, "1", "true", "normal"])
    | st.text(max_size=3)
    | st.sampled_from(["", " ", " x", "x ", "x\n", "x\x00", "é", "a" * 101, "\ud800"])
    | st.just([])
    | st.just({})
    | st.sampled_from([["fp16"], ["fp17"], {"A": "b"}, {"A": 1}, {"A": " b"}, {"A": None}])
)
_name = st.sampled_from(["train", "j1", "x" * 100, "a b", "résumé", "sweep-3"])
_path = st.sampled_from(["", "/ckpt", "/data/run-1", "relative", "/" + "p" * 499])
_env = st.dictionaries(
    st.sampled_from(["A", "LR", "_X", "bad-name", "CUDA_VISIBLE_DEVICES"]),
    st.sampled_from(["", "1", "0.001", "x" * 4096, "a b"]),
    max_size=3,
)
# Submissions as clients send them, mostly plainly valid: the parser must answer these.
_plain_bodies = st.fixed_dictionaries(
    {"project": st.sampled_from(["alpha", "beta", "no-such", "a_b-1"]), "name": _name},
    optional={
        "command": st.sampled_from(["sleep 3600", "python train.py --lr 0.1", "x" * 10_000]),
        "image": st.sampled_from(["", "pytorch:24.01", "registry.example/x:1"]),
        "gpus": st.integers(1, 16) | st.sampled_from([4096, 4097, 0]),
        "gpu_milli": st.integers(1, 1000),
        "gpu_memory_mib": st.integers(0, 81920),
        "gpu_model": st.sampled_from(["H100-80GB-SXM", "L4", "no-such-gpu", None]),
        "min_gpu_memory_gb": st.integers(0, 1000),
        "precisions": st.lists(st.sampled_from(["fp16", "bf16", "fp8", "tf32"]), max_size=8),
        "nodes": st.none() | st.integers(1, 512),
        "gpus_per_node": st.none() | st.integers(1, 16),
        "cpu_milli": st.integers(0, 4_096_000),
        "memory_mib": st.integers(0, 1024),
        "priority": st.sampled_from(["low", "normal", "high", "urgent", "NORMAL"]),
        "preemptible": st.booleans(),
        "runtime_estimate_s": st.none() | st.integers(1, 90 * 86400),
        "time_limit_s": st.none() | st.integers(60, 90 * 86400),
        "checkpoint": _path,
        "working_dir": _path,
        "env": _env,
        "secret_env": _env,
        "max_restarts": st.integers(0, 10),
        "elastic_min": st.none() | st.integers(1, 8),
        "elastic_max": st.none() | st.integers(1, 8),
        "shard_count": st.integers(1, 1000),
        "dependencies": st.just([]),
        "pool": st.sampled_from(["default", None]),
    },
)


@st.composite
def _bodies(draw: st.DrawFn) -> Any:
    """A client's submission, sometimes with one value replaced by an odd one, a required
    field left out, or an unknown field added."""
    body = draw(_plain_bodies)
    change = draw(st.sampled_from(["none", "none", "odd", "drop", "unknown"]))
    if change == "odd":
        name = draw(st.sampled_from(sorted(JobCreateSerializer._declared_fields)))
        body[name] = draw(_odd)
    elif change == "drop":
        body.pop(draw(st.sampled_from(sorted(body))))
    elif change == "unknown":
        body["gpu"] = draw(_odd)
    return body


def _serialized(body: Any) -> dict[str, Any] | None:
    serializer = JobCreateSerializer(data=body)
    return dict(serializer.validated_data) if serializer.is_valid() else None


def _same(plain: dict[str, Any], drf: dict[str, Any]) -> None:
    assert plain == drf
    for name, value in drf.items():  # True is no 1, and a model the same row
        assert type(plain[name]) is type(value), name


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=_bodies())
def test_the_plain_parse_is_the_serializers_wherever_it_answers(fleet, body):
    plain = SUBMIT_PARSER.parse(body)
    if plain is not None:
        drf = _serialized(body)
        assert drf is not None, "the plain parser accepted what the serializer refuses"
        _same(plain, drf)


def test_what_clients_send_is_parsed_plainly(fleet):
    """The benchmark's, the CLI's and the docs' submissions take the plain path."""
    bodies = [
        {
            "project": "alpha",
            "name": "j1",
            "command": "sleep 3600",
            "gpu_model": "H100-80GB-SXM",
            "gpus": 1,
        },
        {"project": "alpha", "name": "train", "command": "python train.py", "gpus": 4},
        {
            "project": "alpha",
            "name": "sweep",
            "command": "python sweep.py",
            "gpus": 2,
            "precisions": ["bf16"],
            "priority": "high",
            "preemptible": True,
            "time_limit_s": 3600,
            "runtime_estimate_s": None,
            "env": {"LR": "0.001", "EMPTY": ""},
            "secret_env": {"WANDB_KEY": "k"},
            "checkpoint": "ckpt:runs/sweep",
            "shard_count": 10,
        },
    ]
    for body in bodies:
        plain = SUBMIT_PARSER.parse(body)
        assert plain is not None, body
        drf = _serialized(body)
        assert drf is not None
        _same(plain, drf)


@pytest.mark.parametrize(
    "change",
    [
        {"gpus": True},  # a bool is no count, though DRF's IntegerField reads it as 1
        {"gpus": "2"},  # DRF reads the string as 2; the serializer decides
        {"name": " padded "},  # DRF trims it
        {"name": ""},
        {"priority": "NORMAL"},
        {"gpu_model": "no-such-gpu"},
        {"dependencies": [{"type": "after_ok", "job": 1}]},
        {"pool": "default"},
        {"env": {"A": " x"}},
        {"precisions": ["fp16", "fp17"]},
        {"extra": 1},
    ],
)
def test_anything_not_plainly_valid_is_left_to_the_serializer(fleet, change):
    body = {"project": "alpha", "name": "j", "command": "true", **change}
    assert SUBMIT_PARSER.parse(body) is None
    assert SUBMIT_PARSER.parse([body]) is None


def test_the_api_answers_the_serializers_messages_for_what_the_parser_leaves(team, fleet, api):
    client = api(team["member"])
    resp = client.post(
        "/api/v1/jobs",
        {"project": "alpha", "name": "  ", "command": "true", "gpus": 0, "gpu": 1},
        format="json",
    )
    assert resp.status_code == 400
    assert set(resp.json()["fields"]) == {"gpu"}  # unknown fields first, as the serializer does
    resp = client.post(
        "/api/v1/jobs",
        {"project": "alpha", "name": "  ", "command": "true", "gpus": 0},
        format="json",
    )
    assert resp.status_code == 400
    assert resp.json()["fields"] == {
        "name": ["This field may not be blank."],
        "gpus": ["Ensure this value is greater than or equal to 1."],
    }


def test_a_serializer_that_validates_as_a_whole_has_no_plain_parse():
    class Whole(serializers.Serializer):  # type: ignore[type-arg]
        a = serializers.IntegerField()

        def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
            return attrs

    class Custom(serializers.Serializer):  # type: ignore[type-arg]
        a = serializers.IntegerField(validators=[lambda v: None])

    with pytest.raises(TypeError):
        PlainParser(Whole).parse({"a": 1})
    assert PlainParser(Custom).parse({"a": 1}) is None  # its own validators: DRF runs them
