"""API shapes for tenancy. Unknown fields are refused rather than silently dropped."""

from __future__ import annotations

import copy
from typing import Any

from django.utils.functional import cached_property
from rest_framework import serializers
from rest_framework.utils.serializer_helpers import BindingDict

from portal.models import ApiToken, Invitation, Membership, Project, Role, TokenScope
from portal.services import TOKEN_MAX_DAYS


class PrototypeFieldsMixin:
    """Fields built and bound once per serializer class, cloned for each instance.

    DRF re-creates every declared field for every serializer instance (a deep copy calls each
    field's `__init__` again), and a ModelSerializer derives its fields from the model anew each
    time: on the submit path that was a fifth of the web worker's CPU. A field is configured
    once and holds nothing of a request: binding it to its name (`bind`: label, source, source
    attributes, a method field's method name) gives the same result for every instance, so it
    is done once, on the prototype, and each instance gets a clone (the prototype's attributes
    in a new object) whose only change is its parent, this serializer. A field that is itself
    a serializer (nested, or `many=True`) keeps state while it validates: it is copied deeply
    and bound, as DRF does. Subclasses get their own prototypes (looked up in the class's own
    dict). `bench.submit_cost` measures the submit path this serves.
    """

    def _prototypes(self) -> dict[str, serializers.Field]:  # type: ignore[type-arg]
        me: Any = self  # a serializer (the mixin comes before one)
        cls = type(self)
        prototype: dict[str, serializers.Field] | None = cls.__dict__.get("_prototype_fields")  # type: ignore[type-arg]
        if prototype is None:
            # Two threads racing here build equal prototypes; either may stay.
            prototype = super().get_fields()  # type: ignore[misc]
            for name, field in prototype.items():
                if not isinstance(field, serializers.BaseSerializer):
                    field.bind(field_name=name, parent=me)
                    field.parent = None  # each clone gets its own; keep no instance alive
            cls._prototype_fields = prototype  # type: ignore[attr-defined]
        return prototype

    def get_fields(self) -> dict[str, serializers.Field]:  # type: ignore[type-arg]
        """Unbound copies, as DRF's `get_fields` returns (`fields` does not call this)."""
        return {name: copy.deepcopy(field) for name, field in self._prototypes().items()}

    @cached_property
    def fields(self) -> BindingDict:
        me: Any = self  # a serializer (the mixin comes before one)
        if type(self).get_fields is not PrototypeFieldsMixin.get_fields:
            bound = BindingDict(me)  # a subclass builds its own fields: DRF's way
            for name, field in self.get_fields().items():
                bound[name] = field
            return bound
        bound = BindingDict(me)
        for name, field in self._prototypes().items():
            if isinstance(field, serializers.BaseSerializer):
                bound[name] = copy.deepcopy(field)  # binds it
            else:
                clone = object.__new__(type(field))
                clone.__dict__.update(field.__dict__)
                clone.parent = me
                bound.fields[name] = clone  # bound already, as the prototype
        return bound


class StrictSerializer(PrototypeFieldsMixin, serializers.Serializer):  # type: ignore[type-arg]
    """Rejects fields it does not know, so a typo is an error and not a silent default."""

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, dict):
            raise serializers.ValidationError(
                {"non_field_errors": ["Send a JSON object with the fields of this resource."]}
            )
        writable = {name for name, field in self.fields.items() if not field.read_only}
        unknown = sorted(set(data) - writable)
        if unknown:
            raise serializers.ValidationError(
                {
                    name: [f"Unknown field. Allowed: {', '.join(sorted(writable))}."]
                    for name in unknown
                }
            )
        return super().to_internal_value(data)


class ProjectSerializer(serializers.ModelSerializer):  # type: ignore[type-arg]
    class Meta:
        model = Project
        fields = ["slug", "name", "description", "created_at"]


class MembershipSerializer(serializers.ModelSerializer):  # type: ignore[type-arg]
    email = serializers.EmailField(source="user.email", read_only=True)
    name = serializers.CharField(source="user.full_name", read_only=True)

    class Meta:
        model = Membership
        fields = ["id", "email", "name", "role", "created_at"]


class MembershipCreateSerializer(StrictSerializer):
    email = serializers.EmailField(max_length=254)
    role = serializers.ChoiceField(choices=Role.choices, default=Role.MEMBER)


class InvitationSerializer(serializers.ModelSerializer):  # type: ignore[type-arg]
    """An invitation sent: the person joins when they accept it from the e-mail."""

    status = serializers.CharField(read_only=True)

    class Meta:
        model = Invitation
        fields = ["id", "email", "role", "status", "created_at", "expires_at"]


class MembershipUpdateSerializer(StrictSerializer):
    role = serializers.ChoiceField(choices=Role.choices)


class ApiTokenSerializer(serializers.ModelSerializer):  # type: ignore[type-arg]
    class Meta:
        model = ApiToken
        fields = [
            "id",
            "name",
            "prefix",
            "scope",
            "created_at",
            "expires_at",
            "last_used_at",
            "revoked_at",
        ]


class ApiTokenCreateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=100)
    scope = serializers.ChoiceField(
        choices=TokenScope.choices,
        default=TokenScope.FULL,
        help_text="read: only reads; submit: also submits, dry-runs and cancels jobs; full: all.",
    )
    expires_in_days = serializers.IntegerField(
        min_value=1,
        max_value=TOKEN_MAX_DAYS,
        required=False,
        help_text="Days until the token stops working; omit it for a token that never expires.",
    )


class IssuedTokenSerializer(ApiTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="Shown once; store it now.")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]
