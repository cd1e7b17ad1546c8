"""Tenancy API: a project's members and personal tokens (projects with their quotas:
`scheduler.api.projects`). Thin: parse, call, serialize."""

from __future__ import annotations

from django.db.models import QuerySet
from django.urls import reverse
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from portal import accounts, selectors, services
from portal.api.idempotency import IdempotentPostMixin
from portal.api.schema import PortalAutoSchema, StrictLimitOffsetPagination
from portal.api.serializers import (
    ApiTokenCreateSerializer,
    ApiTokenSerializer,
    InvitationSerializer,
    IssuedTokenSerializer,
    MembershipCreateSerializer,
    MembershipSerializer,
    MembershipUpdateSerializer,
)
from portal.models import ApiToken, Membership, Project, Role


class MembershipViewSet(
    IdempotentPostMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,  # type: ignore[type-arg]
):
    """Members of one project. Everyone in the project reads; owners change."""

    schema = PortalAutoSchema()
    pagination_class = StrictLimitOffsetPagination

    serializer_class = MembershipSerializer
    lookup_value_regex = r"\d+"
    http_method_names = ["get", "post", "patch", "delete"]

    def _project(self) -> Project:
        return selectors.project_get_visible(
            user=self.request.user,  # type: ignore[arg-type]
            slug=self.kwargs["project_slug"],
        )

    def get_queryset(self) -> QuerySet[Membership]:
        return selectors.membership_list(project=self._project())

    @extend_schema(
        request=MembershipCreateSerializer,
        responses=InvitationSerializer,
        description=(
            "Invite an e-mail address (owners): an invitation is e-mailed and the person joins "
            "when they accept it. The answer is the same whether the address has an account."
        ),
    )
    def create(self, request: Request, project_slug: str) -> Response:
        body = MembershipCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        issued = accounts.invitation_create(
            actor=request.user,  # type: ignore[arg-type]
            project=self._project(),
            email=body.validated_data["email"],
            role=body.validated_data.get("role", Role.MEMBER),
            base_url=request.build_absolute_uri("/"),
        )
        return Response(
            InvitationSerializer(issued.invitation).data, status=status.HTTP_201_CREATED
        )

    @extend_schema(request=MembershipUpdateSerializer, responses=MembershipSerializer)
    def partial_update(self, request: Request, project_slug: str, pk: str) -> Response:
        body = MembershipUpdateSerializer(data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        project = self._project()
        role = body.validated_data.get("role")
        if role is None:  # a PATCH that changes nothing: still the owner's call, answered as is
            current = selectors.membership_list(project=project).filter(pk=int(pk))
            role = current.values_list("role", flat=True).first() or Role.VIEWER
        membership = services.membership_change_role(
            actor=request.user,  # type: ignore[arg-type]
            project=project,
            membership_id=int(pk),
            role=role,
        )
        return Response(MembershipSerializer(membership).data)

    def update(self, request: Request, *args: object, **kwargs: object) -> Response:
        return self.partial_update(request, *args, **kwargs)  # type: ignore[arg-type]

    def destroy(self, request: Request, project_slug: str, pk: str) -> Response:
        services.membership_remove(
            actor=request.user,  # type: ignore[arg-type]
            project=self._project(),
            membership_id=int(pk),
        )
        return Response(status=status.HTTP_204_NO_CONTENT)


class ApiTokenViewSet(
    IdempotentPostMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,  # type: ignore[type-arg]
):
    """Your personal API tokens. The secret appears only in the response that creates it."""

    schema = PortalAutoSchema()
    pagination_class = StrictLimitOffsetPagination

    serializer_class = ApiTokenSerializer
    lookup_value_regex = r"\d+"

    def get_queryset(self) -> QuerySet[ApiToken]:
        return selectors.token_list_of(user=self.request.user)  # type: ignore[arg-type]

    @extend_schema(request=ApiTokenCreateSerializer, responses={201: IssuedTokenSerializer})
    def create(self, request: Request) -> Response:
        body = ApiTokenCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        issued = services.token_create(
            user=request.user,  # type: ignore[arg-type]
            name=body.validated_data["name"],
            scope=body.validated_data["scope"],
            expires_in_days=body.validated_data.get("expires_in_days"),
        )
        data = dict(ApiTokenSerializer(issued.token).data)
        data["token"] = issued.secret
        location = reverse("api-token-detail", args=[issued.token.pk])
        return Response(data, status=status.HTTP_201_CREATED, headers={"Location": location})

    @extend_schema(request=None, responses={204: None})
    def destroy(self, request: Request, pk: str) -> Response:
        services.token_revoke(user=request.user, token_id=int(pk))  # type: ignore[arg-type]
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses=ApiTokenSerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str) -> Response:
        token = services.token_revoke(user=request.user, token_id=int(pk))  # type: ignore[arg-type]
        return Response(ApiTokenSerializer(token).data)
