"""Storage API: a project's volumes and datasets (with their resumable upload), its storage
quota and requests for more. Thin: parse, call a service or selector, serialize."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.parsers import BaseParser, JSONParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.api.idempotency import IdempotentPostMixin
from portal.api.schema import PortalAutoSchema, StrictLimitOffsetPagination
from portal.models import Project, User
from portal.selectors import project_get_visible
from storage import datasets, quota_requests, selectors, services
from storage.api.serializers import (
    DecisionSerializer,
    StorageQuotaSerializer,
    StorageQuotaSetSerializer,
    StorageRequestSerializer,
    UploadStartSerializer,
    UploadStatusSerializer,
    VolumeCreateSerializer,
    VolumeSerializer,
)
from storage.models import Volume

OFFSET_HEADER = "Upload-Offset"


class OctetStreamParser(BaseParser):
    """A chunk of an upload: the raw bytes of the body."""

    media_type = "application/octet-stream"

    def parse(  # type: ignore[override]
        self, stream: Any, media_type: Any = None, parser_context: Any = None
    ) -> bytes:
        return bytes(stream.read()) if stream is not None else b""


def _user(request: Request) -> User:
    return request.user  # type: ignore[return-value]


class VolumeViewSet(
    IdempotentPostMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,  # type: ignore[type-arg]
):
    """A project's volumes. Everyone in the project reads; owners and members create and
    delete; a volume that active jobs mount cannot be deleted (409)."""

    schema = PortalAutoSchema()
    pagination_class = StrictLimitOffsetPagination
    serializer_class = VolumeSerializer
    lookup_field = "name"
    lookup_value_regex = r"[a-z0-9-]+"
    http_method_names = ["get", "post", "patch", "delete"]
    parser_classes = [JSONParser, OctetStreamParser]

    def _project(self) -> Project:
        return project_get_visible(user=_user(self.request), slug=self.kwargs["project_slug"])

    def get_queryset(self) -> QuerySet[Volume]:
        return selectors.volume_list(project=self._project())

    def get_object(self) -> Volume:
        return selectors.volume_get(project=self._project(), name=self.kwargs["name"])

    @extend_schema(request=VolumeCreateSerializer, responses={201: VolumeSerializer})
    def create(self, request: Request, project_slug: str) -> Response:
        """Create a volume (or a dataset) within the project's storage quota; over the quota is
        a 400 naming `size_gib` and the numbers."""
        body = VolumeCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        volume = services.volume_create(
            actor=_user(request), project=self._project(), **body.validated_data
        )
        return Response(VolumeSerializer(volume).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: None})
    def destroy(self, request: Request, project_slug: str, name: str) -> Response:
        volume = self.get_object()
        services.volume_delete(actor=_user(request), project=volume.project, volume_id=volume.pk)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        methods=["GET"],
        request=None,
        responses=UploadStatusSerializer,
        description="How far the dataset's upload or import is: resume from `offset`.",
    )
    @extend_schema(
        methods=["POST"],
        request=UploadStartSerializer,
        responses=UploadStatusSerializer,
        description=(
            "Start uploading the dataset's file (its name and total size); the same name and "
            "size again resumes at the offset received."
        ),
    )
    @extend_schema(
        methods=["PATCH"],
        request={"application/octet-stream": OpenApiTypes.BINARY},
        responses=UploadStatusSerializer,
        parameters=[
            OpenApiParameter(
                OFFSET_HEADER,
                OpenApiTypes.INT,
                OpenApiParameter.HEADER,
                required=True,
                description="Where this chunk starts: the offset the server reported.",
            )
        ],
        description=(
            "Send the next chunk (raw bytes) at the reported offset; any other offset is a 409. "
            "The last chunk completes the dataset and records its SHA-256."
        ),
    )
    @action(detail=True, methods=["get", "post", "patch"], url_path="upload")
    def upload(self, request: Request, project_slug: str, name: str) -> Response:
        volume = self.get_object()
        if request.method == "POST":
            body = UploadStartSerializer(data=request.data)
            body.is_valid(raise_exception=True)
            volume = datasets.dataset_upload_start(
                actor=_user(request),
                volume=volume,
                file_name=body.validated_data["file_name"],
                size_bytes=body.validated_data["size_bytes"],
            )
        elif request.method == "PATCH":
            raw = request.headers.get(OFFSET_HEADER, "")
            volume = datasets.dataset_upload_chunk(
                actor=_user(request),
                volume=volume,
                offset=int(raw) if raw.isascii() and raw.isdigit() else None,
                data=request.data if isinstance(request.data, bytes) else None,
            )
        return Response(UploadStatusSerializer(datasets.dataset_progress(volume)).data)


class StorageQuotaView(APIView):
    """A project's storage quota and what its volumes take (everyone in the project);
    operators set it with PUT."""

    schema = PortalAutoSchema()

    @extend_schema(responses=StorageQuotaSerializer)
    def get(self, request: Request, project_slug: str) -> Response:
        project = project_get_visible(user=_user(request), slug=project_slug)
        return Response(self._body(project))

    @extend_schema(request=StorageQuotaSetSerializer, responses=StorageQuotaSerializer)
    def put(self, request: Request, project_slug: str) -> Response:
        project = project_get_visible(user=_user(request), slug=project_slug)
        body = StorageQuotaSetSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        services.storage_quota_set(
            actor=_user(request), project=project, max_gib=body.validated_data["max_gib"]
        )
        return Response(self._body(project))

    @staticmethod
    def _body(project: Project) -> dict[str, Any]:
        usage = selectors.storage_usage(project=project)
        return dict(
            StorageQuotaSerializer(
                {
                    "quota_gib": usage.quota_gib,
                    "allocated_gib": usage.allocated_gib,
                    "free_gib": usage.free_gib,
                    "used_bytes": usage.used_bytes,
                    "volumes": usage.volumes,
                }
            ).data
        )


class StorageRequestViewSet(
    IdempotentPostMixin,
    mixins.ListModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet,  # type: ignore[type-arg]
):
    """Requests for a larger storage quota: owners ask (and see them), operators decide."""

    schema = PortalAutoSchema()
    pagination_class = StrictLimitOffsetPagination
    serializer_class = StorageRequestSerializer

    def _project(self) -> Project:
        return project_get_visible(user=_user(self.request), slug=self.kwargs["project_slug"])

    def get_queryset(self) -> QuerySet[Any]:
        return selectors.storage_requests_of(project=self._project())

    def create(self, request: Request, project_slug: str) -> Response:
        body = StorageRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        made = quota_requests.storage_request_create(
            actor=_user(request),
            project=self._project(),
            max_gib=body.validated_data["max_gib"],
            justification=body.validated_data["justification"],
        )
        return Response(StorageRequestSerializer(made).data, status=status.HTTP_201_CREATED)


class StorageRequestDecideView(IdempotentPostMixin, APIView):
    """Operators approve (the quota becomes what was asked) or decline with a reason."""

    schema = PortalAutoSchema()

    @extend_schema(request=DecisionSerializer, responses=StorageRequestSerializer)
    def post(self, request: Request, request_id: int) -> Response:
        body = DecisionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        if body.validated_data["decision"] == "approve":
            decided = quota_requests.storage_request_approve(
                actor=_user(request), request_id=request_id, reason=body.validated_data["reason"]
            )
        else:
            decided = quota_requests.storage_request_decline(
                actor=_user(request), request_id=request_id, reason=body.validated_data["reason"]
            )
        return Response(StorageRequestSerializer(decided).data)
