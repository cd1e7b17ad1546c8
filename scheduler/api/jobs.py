"""Jobs API: submit (JSON or a Kubernetes manifest), dry run, list, detail, cancel, events, logs."""

from __future__ import annotations

import json
from typing import Any

import yaml
from django.db.models import QuerySet
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    extend_schema,
    extend_schema_field,
    extend_schema_view,
)
from rest_framework import mixins, parsers, renderers, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import Throttled
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils import encoders

from foundation.fastjson import JSONRenderer
from foundation.params import whole_number
from foundation.plainparse import UNRESOLVED, PlainParser
from foundation.ratelimit import (
    FixedWindowScopedThrottle,
    OneRoundTripThrottlesMixin,
    scope_allows,
)
from portal.api.idempotency import IdempotentPostMixin
from portal.api.schema import (
    NUL_FREE,
    PortalAutoSchema,
    StrictJSONParser,
    StrictLimitOffsetPagination,
)
from portal.api.serializers import PrototypeFieldsMixin, StrictSerializer
from portal.errors import NotFound
from portal.models import Project, User
from portal.selectors import project_get_visible
from scheduler import job_templates, selectors
from scheduler.admission import JobSpec, job_cancel, job_submit
from scheduler.dependencies import (
    MAX_DEPENDENCIES,
    array_retry_failed,
    array_view,
    is_array_root,
)
from scheduler.elastic import job_resize_request
from scheduler.estimates import job_dry_run, job_hourly_cost
from scheduler.job_request import BY_NAME, api_bounds
from scheduler.manifests import ManifestRefused, job_manifest, parse_manifest
from scheduler.models import (
    PRECISIONS,
    DependencyKind,
    GpuModel,
    Job,
    JobEvent,
    JobState,
    JobTemplate,
    Pool,
    PriorityClass,
)

PRIORITIES = [p.lower() for p in PriorityClass.names]
_STATE = "|".join(JobState.values)
STATE_LIST_PATTERN = f"^(({_STATE})(,({_STATE}))*)?$"  # empty: no filter


class CatalogModelField(serializers.SlugRelatedField):  # type: ignore[type-arg]
    """An active GPU model by name (one compiled query); a name PostgreSQL cannot even
    compare (NUL) is simply unknown."""

    default_error_messages = {
        "does_not_exist": "Unknown GPU model '{value}'. GET /api/v1/gpu-models lists them.",
        "invalid": "A GPU model's name, as a string.",
    }

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str):
            self.fail("invalid")
        model = None if "\x00" in data else selectors.gpu_model_active(data)
        if model is None:
            self.fail("does_not_exist", value=data.replace("\x00", "")[:100])
        return model


class DependencySerializer(StrictSerializer):
    type = serializers.ChoiceField(
        choices=DependencyKind.values,
        help_text="after_ok: once it succeeded; after_any: once it ended (Slurm's afterok, "
        "afterany).",
    )
    job = serializers.IntegerField(
        min_value=1, max_value=2**63 - 1, help_text="A job id; an array's id means all shards."
    )


class VolumeRequestSerializer(StrictSerializer):
    name = serializers.CharField(max_length=63, help_text="The project's volume (or a scratch's).")
    path = serializers.CharField(
        max_length=500, required=False, help_text="In the container; default /data/<name>."
    )
    # the request's name; DRF takes declared fields off the class, so Field.read_only stays a bool
    read_only = serializers.BooleanField(default=False)  # type: ignore[assignment]
    kind = serializers.ChoiceField(
        choices=["scratch"],
        required=False,
        help_text="scratch: a per-job volume, not the project's.",
    )
    size_gib = serializers.IntegerField(
        min_value=1, max_value=10_000, required=False, help_text="A scratch volume's size."
    )


# Keys that once took a host path: answered with what replaced them, never a silent default.
RETIRED_KEYS = {
    "checkpoint_dir": "Host paths are not accepted: checkpoints live on a volume. Give "
    "checkpoint as '<volume>:<path inside it>', e.g. 'ckpt:runs/a'.",
}


# A job request as the API takes it: bounds and defaults from `scheduler.job_request`; the
# fields that name catalog rows or parse a syntax are written here. (No docstring: it would
# become the schema's description.)
class JobCreateSerializer(StrictSerializer):
    project: serializers.SlugField = serializers.SlugField(max_length=50)
    name = serializers.CharField(**api_bounds("name"))
    command = serializers.CharField(**api_bounds("command"))
    image = serializers.CharField(**api_bounds("image"))
    gpus = serializers.IntegerField(**api_bounds("gpus"))
    gpu_milli = serializers.IntegerField(**api_bounds("gpu_milli"))
    gpu_memory_mib = serializers.IntegerField(**api_bounds("gpu_memory_mib"))
    gpu_model: serializers.SlugRelatedField = CatalogModelField(  # type: ignore[type-arg]
        slug_field="name",
        queryset=GpuModel.objects.filter(is_active=True),
        required=False,
        allow_null=True,
    )
    min_gpu_memory_gb = serializers.IntegerField(**api_bounds("min_gpu_memory_gb"))
    precisions = serializers.ListField(
        child=serializers.ChoiceField(choices=PRECISIONS), max_length=7, default=list
    )
    nodes = serializers.IntegerField(**api_bounds("nodes"))
    gpus_per_node = serializers.IntegerField(**api_bounds("gpus_per_node"))
    cpu_milli = serializers.IntegerField(**api_bounds("cpu_milli"))
    memory_mib = serializers.IntegerField(**api_bounds("memory_mib"))
    priority = serializers.ChoiceField(choices=PRIORITIES, default="normal")
    preemptible = serializers.BooleanField(**api_bounds("preemptible"))
    runtime_estimate_s = serializers.IntegerField(**api_bounds("runtime_estimate_s"))
    time_limit_s = serializers.IntegerField(
        **api_bounds("time_limit_s"), help_text=BY_NAME["time_limit_s"].help
    )
    volumes = serializers.ListField(
        child=VolumeRequestSerializer(),
        max_length=16,
        default=list,
        help_text=BY_NAME["volumes"].help,
    )
    checkpoint = serializers.CharField(
        **api_bounds("checkpoint"), help_text=BY_NAME["checkpoint"].help
    )
    working_dir = serializers.CharField(
        **api_bounds("working_dir"), help_text=BY_NAME["working_dir"].help
    )
    env = serializers.DictField(
        child=serializers.CharField(max_length=4096, allow_blank=True), default=dict
    )
    secret_env = serializers.DictField(
        child=serializers.CharField(max_length=4096, allow_blank=True),
        default=dict,
        write_only=True,
        help_text="Write-only: answered masked (names only) to everyone, staff included, and "
        "sent only to the node that runs the job.",
    )
    max_restarts = serializers.IntegerField(**api_bounds("max_restarts"))
    elastic_min = serializers.IntegerField(**api_bounds("elastic_min"))
    elastic_max = serializers.IntegerField(**api_bounds("elastic_max"))
    shard_count = serializers.IntegerField(**api_bounds("shard_count"))
    dependencies = serializers.ListField(
        child=DependencySerializer(),
        max_length=MAX_DEPENDENCIES,
        default=list,
        help_text="Start only after these jobs (Slurm's --dependency); one that can no longer "
        "be met fails the job.",
    )
    pool: serializers.SlugRelatedField = serializers.SlugRelatedField(  # type: ignore[type-arg]
        slug_field="name",
        queryset=Pool.objects.all(),
        required=False,
        allow_null=True,
        help_text="A pool by name (e.g. a Slurm-backed one); blank: any pool of our agents.",
    )

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict) and (retired := sorted(set(data) & set(RETIRED_KEYS))):
            raise serializers.ValidationError({key: [RETIRED_KEYS[key]] for key in retired})
        return super().to_internal_value(data)

    def to_spec(self, source: str = Job.Source.API) -> tuple[str, JobSpec]:
        return spec_from_validated(self.validated_data, source)


def spec_from_validated(
    validated: dict[str, Any], source: str = Job.Source.API
) -> tuple[str, JobSpec]:
    """The project's slug and the spec of a `JobCreateSerializer`'s validated data."""
    d = dict(validated)
    project = d.pop("project")
    d["priority"] = PriorityClass[d["priority"].upper()].value
    d["precisions"] = tuple(d.get("precisions", ()))
    d["dependencies"] = tuple((x["type"], x["job"]) for x in d.get("dependencies", ()))
    d["volumes"] = tuple(dict(v) for v in d.get("volumes", ()))
    return project, JobSpec(**d, source=source)


def _active_model(value: Any) -> Any:
    """What `CatalogModelField` makes of a model's name, where it accepts it."""
    if type(value) is not str or not value or "\x00" in value:
        return UNRESOLVED
    model = selectors.gpu_model_active(value)
    return UNRESOLVED if model is None else model


# Fast path (`bench.submit_cost`): plainly valid submissions skip building the serializer.
SUBMIT_PARSER = PlainParser(JobCreateSerializer, resolvers={"gpu_model": _active_model})


def submission_parse(body: Any) -> tuple[str, JobSpec]:
    """The project's slug and the spec of a submission's body, or the serializer's 400."""
    validated = SUBMIT_PARSER.parse(body)
    if validated is None:
        create = JobCreateSerializer(data=body)
        create.is_valid(raise_exception=True)
        validated = create.validated_data
    return spec_from_validated(validated)


class TemplateCreateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=100)


class JobTemplateSerializer(serializers.ModelSerializer):  # type: ignore[type-arg]
    project: serializers.SlugRelatedField = serializers.SlugRelatedField(  # type: ignore[type-arg]
        slug_field="slug", read_only=True
    )
    created_by = serializers.EmailField(source="created_by.email", read_only=True, default=None)

    class Meta:
        model = JobTemplate
        fields = ["id", "name", "project", "created_by", "body", "source_job", "created_at"]


class JobSerializer(PrototypeFieldsMixin, serializers.ModelSerializer):  # type: ignore[type-arg]
    project: serializers.SlugRelatedField = serializers.SlugRelatedField(  # type: ignore[type-arg]
        slug_field="slug", read_only=True
    )
    gpu_model: serializers.SlugRelatedField = serializers.SlugRelatedField(  # type: ignore[type-arg]
        slug_field="name", read_only=True, allow_null=True
    )
    submitted_by = serializers.EmailField(source="submitted_by.email", read_only=True)
    priority = serializers.SerializerMethodField()
    pending = serializers.SerializerMethodField()

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "project",
            "state",
            "source",
            "submitted_by",
            "command",
            "image",
            "image_digest",
            "gpus",
            "gpu_milli",
            "gpu_memory_mib",
            "gpu_model",
            "gpu_models",
            "min_gpu_memory_gb",
            "precisions",
            "nodes",
            "gpus_per_node",
            "cpu_milli",
            "memory_mib",
            "shm_mib",
            "priority",
            "preemptible",
            "borrowed",
            "runtime_estimate_s",
            "time_limit_s",
            "volumes",
            "checkpoint",
            "max_restarts",
            "restarts",
            "elastic_min",
            "elastic_max",
            "shard_index",
            "shard_count",
            "array_parent",
            "attempt",
            "pending",
            "exit_code",
            "failure_reason",
            "created_at",
            "queued_at",
            "started_at",
            "finished_at",
            "manifest_ignored",
        ]

    def get_priority(self, obj: Job) -> str:
        return PriorityClass(obj.priority).name.lower()

    def get_pending(self, obj: Job) -> dict[str, Any] | None:
        """Why the job waits, its queue position and estimated start, while it is queued."""
        if obj.state != JobState.QUEUED:
            return None
        return {
            "reason": obj.pending_reason or "waiting_in_queue",
            "message": obj.pending_message or "Waiting for the next scheduling cycle.",
            "queue_position": obj.queue_position,
            "estimated_start": obj.estimated_start_at,
        }


class ManifestFindingSerializer(serializers.Serializer):  # type: ignore[type-arg]
    field = serializers.CharField(help_text="The manifest's field, as a path.")
    why = serializers.CharField()


class ManifestJobSerializer(JobSerializer):
    ignored = ManifestFindingSerializer(
        source="manifest_ignored",
        many=True,
        read_only=True,
        help_text="The manifest's fields that were accepted but change nothing, and why.",
    )

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "ignored"]


class ManifestRefusedSerializer(serializers.Serializer):  # type: ignore[type-arg]
    """The one error shape (code, message, fields) plus every refused field of the manifest."""

    code = serializers.CharField()
    message = serializers.CharField()
    fields = serializers.DictField(  # type: ignore[assignment]  # DRF pops declared fields
        child=serializers.ListField(child=serializers.CharField()),
        help_text="`manifest`: each refusal as 'field: why'.",
    )
    detail = serializers.CharField(required=False, help_text="The same as `message`.")
    refused = ManifestFindingSerializer(
        many=True, required=False, help_text="Every field refused, and why."
    )
    manifest = serializers.ListField(child=serializers.CharField(), required=False)


class PlacementSerializer(serializers.Serializer):  # type: ignore[type-arg]
    node = serializers.CharField()
    gpu_index = serializers.IntegerField()
    gpu_uuid = serializers.CharField()
    gpu_model = serializers.CharField()
    share_milli = serializers.IntegerField()
    capacity_milli = serializers.IntegerField(
        help_text="The GPU's capacity: 1000 per device, ×N when time-sliced N ways."
    )
    since = serializers.DateTimeField()


class HourlyCostSerializer(serializers.Serializer):  # type: ignore[type-arg]
    cost_per_hour = serializers.DecimalField(
        max_digits=12,
        decimal_places=2,
        help_text="Exact for the GPUs the job holds; else the cheapest model it may land on.",
    )
    cost_per_hour_most = serializers.DecimalField(
        max_digits=12,
        decimal_places=2,
        allow_null=True,
        help_text="Not placed and no model named: the cost on the dearest model it may land on.",
    )


class JobDependencyOutSerializer(serializers.Serializer):  # type: ignore[type-arg]
    type = serializers.CharField(source="kind")
    job = serializers.IntegerField(source="on_id")
    whole_array = serializers.BooleanField(help_text="The job is an array: all its shards.")


class MemberSerializer(serializers.Serializer):  # type: ignore[type-arg]
    rank = serializers.IntegerField(help_text="NODE_RANK; rank 0 hosts the rendezvous.")
    first_rank = serializers.IntegerField(help_text="RANK: the global rank of its first GPU.")
    node = serializers.CharField()
    gpus = serializers.IntegerField()
    state = serializers.CharField()
    exit_code = serializers.IntegerField(allow_null=True)
    message = serializers.CharField()
    started_at = serializers.DateTimeField(allow_null=True)
    ended_at = serializers.DateTimeField(allow_null=True)


class ResizeSerializer(StrictSerializer):
    gpus = serializers.IntegerField(
        min_value=1, max_value=4096, help_text="The GPUs the elastic job runs on from now on."
    )


class JobDetailSerializer(JobSerializer):
    env = serializers.DictField(read_only=True)
    secret_env = serializers.DictField(
        source="secret_env_masked",
        read_only=True,
        help_text="The secret variables' names; every value is masked.",
    )
    placement = serializers.SerializerMethodField()
    members = serializers.SerializerMethodField()
    resize = serializers.DictField(
        read_only=True, help_text="A resize in flight: from, to, reason (empty when none)."
    )
    cost = serializers.SerializerMethodField()
    dependencies = serializers.SerializerMethodField()
    legacy_host_paths = serializers.DictField(
        child=serializers.CharField(),
        read_only=True,
        help_text="A job from before volumes: the host paths it named (never used again).",
    )

    class Meta(JobSerializer.Meta):
        fields = [
            *JobSerializer.Meta.fields,
            "env",
            "secret_env",
            "working_dir",
            "legacy_host_paths",
            "placement",
            "members",
            "resize",
            "cost",
            "dependencies",
            "waiting_on_dependencies",
        ]

    @extend_schema_field(JobDependencyOutSerializer(many=True))
    def get_dependencies(self, obj: Job) -> list[dict[str, object]]:
        return list(JobDependencyOutSerializer(obj.dependencies.order_by("pk"), many=True).data)

    @extend_schema_field(PlacementSerializer(many=True))
    def get_placement(self, obj: Job) -> list[dict[str, object]]:
        return selectors.job_placement(obj)

    @extend_schema_field(MemberSerializer(many=True))
    def get_members(self, obj: Job) -> list[dict[str, object]]:
        """A gang's members (one per node) in its latest attempt; empty for one node."""
        return selectors.job_members(obj)

    @extend_schema_field(HourlyCostSerializer(allow_null=True))
    def get_cost(self, obj: Job) -> dict[str, object] | None:
        """What the job costs per hour while it runs (null once it ended, or no model fits)."""
        cost = job_hourly_cost(obj)
        if cost is None:
            return None
        return {
            "cost_per_hour": f"{cost.low:.2f}",
            "cost_per_hour_most": None if cost.high is None else f"{cost.high:.2f}",
        }


class JobEventSerializer(serializers.ModelSerializer):  # type: ignore[type-arg]
    class Meta:
        model = JobEvent
        fields = ["created_at", "from_state", "to_state", "actor_label", "reason"]


class ArrayShardSerializer(serializers.ModelSerializer):  # type: ignore[type-arg]
    class Meta:
        model = Job
        fields = [
            "id",
            "shard_index",
            "state",
            "attempt",
            "restarts",
            "exit_code",
            "failure_reason",
            "started_at",
            "finished_at",
        ]


class ArraySerializer(serializers.Serializer):  # type: ignore[type-arg]
    array = serializers.IntegerField(source="root.pk", help_text="The array's id (shard 0's).")
    name = serializers.CharField(source="root.name")
    total = serializers.IntegerField()
    done = serializers.IntegerField()
    succeeded = serializers.IntegerField()
    failed = serializers.IntegerField()
    by_state = serializers.DictField(child=serializers.IntegerField())
    shards = ArrayShardSerializer(many=True)


class DryRunSerializer(serializers.Serializer):  # type: ignore[type-arg]
    admitted = serializers.BooleanField()
    borrowed = serializers.BooleanField()
    admission_reason = serializers.CharField()
    quota_notes = serializers.ListField(child=serializers.CharField())
    would_start_now = serializers.BooleanField()
    estimated_start = serializers.DateTimeField(allow_null=True)
    wait_reason = serializers.CharField()
    wait_message = serializers.CharField()
    queue_position = serializers.IntegerField(allow_null=True)
    rate_per_gpu_hour = serializers.DecimalField(max_digits=10, decimal_places=4, allow_null=True)
    cost_per_hour = serializers.DecimalField(max_digits=12, decimal_places=2, allow_null=True)
    cost_for_estimate = serializers.DecimalField(max_digits=14, decimal_places=2, allow_null=True)
    cost_per_hour_most = serializers.DecimalField(
        max_digits=12,
        decimal_places=2,
        allow_null=True,
        help_text="With no GPU model named and no start now: the cost per hour on the dearest "
        "model the job may land on (cost_per_hour is the cheapest).",
    )
    answered_by = serializers.CharField(
        help_text="Who answered when and where: 'portal' (our plan) or 'slurm' (a Slurm pool: "
        "sbatch --test-only on Slurm's current queue, quoted in wait_message)."
    )


class YamlParser(parsers.BaseParser):
    media_type = "application/yaml"

    def parse(  # type: ignore[override]  # the raw manifest, parsed by the view
        self, stream: Any, media_type: str | None = None, parser_context: Any = None
    ) -> bytes:
        data: bytes = stream.read(256 * 1024 + 1)
        return data


class TextYamlParser(YamlParser):
    media_type = "text/yaml"


class PlainTextParser(YamlParser):
    media_type = "text/plain"


class YamlRenderer(renderers.BaseRenderer):
    """A Job manifest (or an error) as YAML."""

    media_type = "application/yaml"
    format = "yaml"
    charset = "utf-8"

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Any = None,
    ) -> bytes:
        if isinstance(data, str):
            return data.encode()
        plain = json.loads(json.dumps(data, cls=encoders.JSONEncoder))  # error details are str
        return yaml.safe_dump(plain, sort_keys=False, allow_unicode=True).encode()


class SubmitMixin(OneRoundTripThrottlesMixin, viewsets.GenericViewSet):  # type: ignore[type-arg]
    """Submitting a request body (resubmission, templates): the create endpoint's steps."""

    @property
    def _user(self) -> User:
        return self.request.user  # type: ignore[return-value]

    def get_throttles(self) -> list[Any]:
        """Submitting and dry runs are expensive: each has its own rate limit."""
        scope = {
            "create": "submit",
            "manifest": "submit",
            "resubmit": "submit",
            "submit": "submit",
            "dry_run": "dry_run",
        }.get(getattr(self, "action", None) or "")
        if scope is None:
            return list(super().get_throttles())  # type: ignore[misc]
        self.throttle_scope = scope
        return [*super().get_throttles(), FixedWindowScopedThrottle()]  # type: ignore[misc]

    def _changes(self, request: Request) -> dict[str, Any]:
        if request.data in (None, b"", ""):
            return {}
        if not isinstance(request.data, dict):
            raise serializers.ValidationError(
                {"non_field_errors": ["Send a JSON object of the fields to change."]}
            )
        return dict(request.data)

    def _submit_body(self, body: dict[str, Any]) -> Response:
        slug, spec = submission_parse(body)
        self._count_shards(spec)
        jobs = job_submit(
            actor=self._user,
            project=self._project(slug),
            spec=spec,
            remote_addr=self.request.META.get("REMOTE_ADDR"),
        )
        return self._submitted(jobs)

    def _project(self, slug: str) -> Project:
        return project_get_visible(user=self._user, slug=slug)

    def _submitted(self, jobs: list[Job]) -> Response:
        body = JobSerializer(jobs, many=True).data if len(jobs) > 1 else JobSerializer(jobs[0]).data
        # An array job answers all its shards; Location names the first.
        location = reverse("api-job-detail", args=[jobs[0].pk])
        return Response(body, status=status.HTTP_201_CREATED, headers={"Location": location})

    def _count_shards(self, spec: JobSpec) -> None:
        """The submit limit counts jobs, not requests: the throttle counted this request once,
        so an array counts its other shards too."""
        if spec.shard_count > 1:
            allowed, retry_after = scope_allows(
                scope="submit", user_pk=self._user.pk, hits=spec.shard_count - 1
            )
            if not allowed:
                raise Throttled(
                    wait=retry_after,
                    detail=f"Submitting {spec.shard_count} shards passes your submit rate limit.",
                )


@extend_schema_view(
    list=extend_schema(
        parameters=[
            OpenApiParameter(
                "state",
                {"type": "string", "pattern": STATE_LIST_PATTERN},
                description="Comma-separated states.",
            ),
            OpenApiParameter("project", {"type": "string", "pattern": NUL_FREE}),
            OpenApiParameter("gpu_model", {"type": "string", "pattern": NUL_FREE}),
        ]
    )
)
class JobViewSet(
    SubmitMixin,
    IdempotentPostMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,  # type: ignore[type-arg]
):
    schema = PortalAutoSchema()
    pagination_class = StrictLimitOffsetPagination
    parser_classes = [StrictJSONParser]  # nested fields (env, precisions): JSON only
    lookup_value_regex = r"\d+"
    token_scope = "submit"  # submit-scoped tokens may submit, dry-run and cancel here

    def get_serializer_class(self) -> type:
        return JobDetailSerializer if self.action == "retrieve" else JobSerializer

    def get_queryset(self) -> QuerySet[Job]:
        qs = selectors.job_list_visible_to(user=self._user)
        if self.action == "list":
            qs = selectors.job_filter(qs, self.request.query_params.dict())
        return qs

    @extend_schema(request=JobCreateSerializer, responses={201: JobSerializer})
    def create(self, request: Request) -> Response:
        slug, spec = submission_parse(request.data)
        self._count_shards(spec)
        jobs = job_submit(
            actor=self._user,
            project=self._project(slug),
            spec=spec,
            remote_addr=request.META.get("REMOTE_ADDR"),
        )
        return self._submitted(jobs)

    @extend_schema(request=JobCreateSerializer, responses={200: DryRunSerializer})
    @action(detail=False, methods=["post"], url_path="dry-run")
    def dry_run(self, request: Request) -> Response:
        slug, spec = submission_parse(request.data)
        result = job_dry_run(project=self._project(slug), spec=spec)
        return Response(DryRunSerializer(result).data)

    @extend_schema(
        request={"application/yaml": OpenApiTypes.STR},
        parameters=[
            OpenApiParameter("project", OpenApiTypes.STR, description="Else metadata.namespace.")
        ],
        responses={
            201: ManifestJobSerializer,
            400: ManifestRefusedSerializer,
            413: ManifestRefusedSerializer,
        },
        description="Submit a Kubernetes batch/v1 Job manifest. Each field is honoured, ignored "
        "(listed in `ignored`) or refused (a 400 listing every refused field in `refused`); "
        "see docs/manifests.md.",
    )
    @action(
        detail=False,
        methods=["post"],
        url_path="manifest",
        parser_classes=[YamlParser, TextYamlParser, PlainTextParser],
    )
    def manifest(self, request: Request) -> Response:
        raw = request.data if isinstance(request.data, bytes) else b""
        if not raw:
            raise serializers.ValidationError(
                {
                    "manifest": [
                        "Send the Job manifest as the request body (Content-Type: application/yaml)."
                    ]
                }
            )
        try:
            imported = parse_manifest(raw)
        except ManifestRefused as exc:
            reasons = [f"{f['field']}: {f['why']}" for f in exc.refused]
            return Response(
                {
                    "code": exc.code,
                    "message": exc.message,
                    "fields": {"manifest": reasons},
                    "detail": exc.message,
                    "refused": exc.refused,
                    "manifest": reasons,
                },
                status=exc.status,
            )
        slug = request.query_params.get("project") or imported.namespace
        if not slug:
            raise serializers.ValidationError(
                {"project": ["Name the project with ?project=<slug> or metadata.namespace."]}
            )
        self._count_shards(imported.spec)
        jobs = job_submit(
            actor=self._user,
            project=self._project(slug),
            spec=imported.spec,
            remote_addr=request.META.get("REMOTE_ADDR"),
        )
        serializer = ManifestJobSerializer
        body = serializer(jobs, many=True).data if len(jobs) > 1 else serializer(jobs[0]).data
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(
        responses={
            (200, "application/yaml"): OpenApiTypes.OBJECT,
            (200, "application/json"): OpenApiTypes.OBJECT,
            (404, "application/json"): OpenApiTypes.OBJECT,
            (404, "application/yaml"): OpenApiTypes.OBJECT,
            (404, "text/html"): OpenApiTypes.STR,  # a path no route matches
        },
        description="The job as a Kubernetes batch/v1 Job manifest: what it asks for, in the "
        "fields the import honours (an array job: its whole array). YAML with "
        "`Accept: application/yaml` (or `?format=yaml`), else JSON.",
    )
    @action(
        detail=True,
        methods=["get"],
        url_path="manifest",
        url_name="manifest-export",
        renderer_classes=[JSONRenderer, YamlRenderer],
    )
    def manifest_export(self, request: Request, pk: str) -> Response:
        job = self.get_object()
        response = Response(job_manifest(job))
        response["Content-Disposition"] = f'inline; filename="job-{job.pk}.yaml"'
        return response

    @extend_schema(
        request=JobCreateSerializer(partial=True),
        responses={201: JobSerializer},
        description="Submit this job's request again as a new job (clone), with any fields of "
        "the submit body changed (edit and resubmit); an empty body resubmits it as it was.",
    )
    @action(detail=True, methods=["post"])
    def resubmit(self, request: Request, pk: str) -> Response:
        job = self.get_object()
        base = job_templates.job_request_body(job)
        return self._submit_body(
            job_templates.resubmit_body(base, self._changes(request), project=job.project)
        )

    @extend_schema(
        request=TemplateCreateSerializer,
        responses={201: JobTemplateSerializer},
        description="Save this job's request as a template of its project.",
    )
    @action(detail=True, methods=["post"], url_path="template")
    def save_template(self, request: Request, pk: str) -> Response:
        job = self.get_object()
        body = TemplateCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        template = job_templates.job_template_create(
            actor=self._user,
            job=job,
            name=body.validated_data["name"],
            remote_addr=request.META.get("REMOTE_ADDR"),
        )
        return Response(
            JobTemplateSerializer(template).data,
            status=status.HTTP_201_CREATED,
            headers={"Location": reverse("api-job-template-detail", args=[template.pk])},
        )

    @extend_schema(request=None, responses={200: JobSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        job = job_cancel(
            actor=self._user, job=self.get_object(), remote_addr=request.META.get("REMOTE_ADDR")
        )
        return Response(JobSerializer(job).data)

    def _array_root(self) -> Job:
        job = self.get_object()
        if job.array_parent_id is not None:
            return job.array_parent  # type: ignore[return-value]
        if not is_array_root(job):
            raise NotFound(f"Job {job.pk} is not part of an array.")
        return job

    @extend_schema(responses={200: ArraySerializer})
    @action(detail=True, methods=["get"], pagination_class=None)
    def array(self, request: Request, pk: str) -> Response:
        """The array this job belongs to: every shard and the counts by state."""
        return Response(ArraySerializer(array_view(self._array_root())).data)

    @extend_schema(request=None, responses={200: JobSerializer(many=True)})
    @action(detail=True, methods=["post"], url_path="retry-failed")
    def retry_failed(self, request: Request, pk: str) -> Response:
        """Queue the array's failed shards again (only those); 409 when none failed."""
        jobs = array_retry_failed(
            actor=self._user, root=self._array_root(), remote_addr=request.META.get("REMOTE_ADDR")
        )
        return Response(JobSerializer(jobs, many=True).data)

    @extend_schema(request=ResizeSerializer, responses={200: JobSerializer})
    @action(detail=True, methods=["post"])
    def resize(self, request: Request, pk: str) -> Response:
        """Ask an elastic running job to restart on `gpus` GPUs (elastic_min..elastic_max):
        it is signalled to checkpoint (SIGTERM, its grace) and restarts with RESUME=1."""
        body = ResizeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        job = job_resize_request(
            actor=self._user,
            job=self.get_object(),
            gpus=body.validated_data["gpus"],
            remote_addr=request.META.get("REMOTE_ADDR"),
        )
        return Response(JobSerializer(job).data)

    @extend_schema(responses={200: JobEventSerializer(many=True)})
    @action(detail=True, methods=["get"], pagination_class=None)  # a plain list, not a page
    def events(self, request: Request, pk: str) -> Response:
        job = self.get_object()
        return Response(JobEventSerializer(job.events.all(), many=True).data)

    @extend_schema(
        parameters=[OpenApiParameter("after", OpenApiTypes.INT, description="Last chunk id seen.")],
        responses={200: OpenApiTypes.OBJECT},
    )
    @action(detail=True, methods=["get"])
    def logs(self, request: Request, pk: str) -> Response:
        job = self.get_object()
        after = whole_number(request.query_params.get("after", "0"), maximum=2**63 - 1)
        if after is None:
            raise serializers.ValidationError(
                {"after": ["A whole number: the last chunk id you have."]}
            )
        text, last = selectors.job_log_text(job, after_id=after)
        return Response(
            {
                "text": text,
                "last": last,
                "state": job.state,
                # output past the log quota was dropped: say so (empty when nothing was)
                "truncated": job.log_quota_hit is not None,
                "note": job.log_truncation_note,
            }
        )


class JobTemplateViewSet(
    SubmitMixin,
    IdempotentPostMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,  # type: ignore[type-arg]
):
    """Job templates of the caller's projects: list, read, delete, submit (with changes)."""

    schema = PortalAutoSchema()
    serializer_class = JobTemplateSerializer
    pagination_class = StrictLimitOffsetPagination
    parser_classes = [StrictJSONParser]
    lookup_value_regex = r"\d+"
    token_scope = "submit"

    def get_queryset(self) -> QuerySet[JobTemplate]:
        return job_templates.job_template_list_visible_to(user=self._user)

    @extend_schema(request=None, responses={204: None})
    def destroy(self, request: Request, pk: str) -> Response:
        job_templates.job_template_delete(
            actor=self._user,
            template=self.get_object(),
            remote_addr=request.META.get("REMOTE_ADDR"),
        )
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        request=JobCreateSerializer(partial=True),
        responses={201: JobSerializer},
        description="Submit a job from this template, with any fields of the submit body changed.",
    )
    @action(detail=True, methods=["post"])
    def submit(self, request: Request, pk: str) -> Response:
        template = self.get_object()
        body = job_templates.resubmit_body(
            template.body, self._changes(request), project=template.project
        )
        return self._submit_body(body)
