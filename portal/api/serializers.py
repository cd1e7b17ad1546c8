"""API shapes for tenancy. Unknown fields are refused rather than silently dropped.

Fast path: `PrototypeFieldsMixin` (fields bound once per class, answers read through a
per-class plan of plain reads), justified by `bench.submit_cost`: every submit answers its job.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, NamedTuple

from django.core.exceptions import ObjectDoesNotExist
from django.utils.functional import cached_property
from rest_framework import fields as drf_fields
from rest_framework import relations, serializers
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

    def to_representation(self, instance: Any) -> Any:
        """DRF's `Serializer.to_representation`, read through the class's `Reader`s.

        DRF walks each field's source with `get_attribute` (a `Mapping` check, a callable
        check and exception handling per step) on fields cloned for this instance; on the
        submit path that was most of answering a job (`bench.submit_cost`). A `Reader` reads a
        plain field's attribute with one `getattr` per step and hands the value to the
        prototype field's own `to_representation` (or keeps it, where that would return it
        unchanged), a method field calls its method: what DRF does for those, in the same
        order. Any other field, or a value that is not a plain one (an exception on the way,
        a callable), goes DRF's way through a field bound to this serializer.
        """
        plan = _representation_plan(self)
        if plan is None or isinstance(instance, Mapping):
            return super().to_representation(instance)  # type: ignore[misc]
        ret = {}
        for reader in plan:
            kind = reader.kind
            if kind == READ_METHOD:
                ret[reader.name] = getattr(self, reader.arg)(instance)
                continue
            value = instance
            try:
                if kind == READ_ATTR:
                    for attr in reader.arg:
                        value = getattr(value, attr)
                        if callable(value):
                            raise _Unplain
                elif kind == READ_PK:
                    value = instance.serializable_value(reader.arg)
                    if value is not None and type(value) is not int:
                        raise _Unplain
                else:
                    raise _Unplain
            except (_Unplain, AttributeError, KeyError, ObjectDoesNotExist):
                self._represent_as_drf(ret, reader.name, instance)
                continue
            if value is None or kind == READ_PK or type(value) is reader.same:
                ret[reader.name] = value
            else:
                ret[reader.name] = reader.field.to_representation(value)
        return ret

    def _represent_as_drf(self, ret: dict[str, Any], name: str, instance: Any) -> None:
        """One field of `to_representation`, as DRF's loop does it."""
        field = self._bound_field(name)
        try:
            attribute = field.get_attribute(instance)
        except drf_fields.SkipField:
            return
        check = attribute.pk if isinstance(attribute, relations.PKOnlyObject) else attribute
        ret[name] = None if check is None else field.to_representation(attribute)

    def _bound_field(self, name: str) -> serializers.Field:  # type: ignore[type-arg]
        """This serializer's own copy of the field `name`, as `fields` would hold it."""
        field = self._prototypes()[name]
        if "fields" in self.__dict__ or isinstance(field, serializers.BaseSerializer):
            return self.fields[name]  # type: ignore[attr-defined,no-any-return]
        me: Any = self  # a serializer (the mixin comes before one)
        clone = object.__new__(type(field))
        clone.__dict__.update(field.__dict__)
        clone.parent = me
        return clone


class _Unplain(Exception):
    """A value a `Reader` leaves to DRF's own `get_attribute`."""


READ_ATTR, READ_PK, READ_METHOD, READ_DRF = "attr", "pk", "method", "drf"
# Exact field classes whose `to_representation` reads nothing but the field's own settings
# (no parent, no context), and the type of value each returns unchanged (None: none).
_READ_FIELDS: dict[type, type | None] = {
    drf_fields.BooleanField: bool,
    drf_fields.CharField: str,
    drf_fields.EmailField: str,
    drf_fields.IntegerField: int,
    drf_fields.BigIntegerField: None,  # COERCE_BIGINT_TO_STRING
    drf_fields.ChoiceField: None,
    drf_fields.DateTimeField: None,
    drf_fields.DateField: None,
    drf_fields.DecimalField: None,
    drf_fields.FloatField: None,
    drf_fields.JSONField: None,
    relations.SlugRelatedField: None,
}


class Reader(NamedTuple):
    """How `PrototypeFieldsMixin.to_representation` reads one field: `kind` READ_ATTR
    (`arg`: the source's attributes; None is None, a value of type `same` is kept, anything
    else goes to `field.to_representation`), READ_PK (`arg`: the relation; its id as DRF's
    primary-key optimisation reads it), READ_METHOD (`arg`: the serializer's method) or
    READ_DRF (DRF's way, on a bound copy of the field)."""

    name: str
    kind: str
    arg: Any
    field: Any
    same: type | None


def _reader(name: str, field: Any) -> Reader | None:
    cls = type(field)
    if isinstance(field, serializers.BaseSerializer):  # nested: bound per instance
        return None
    if cls is serializers.SerializerMethodField:
        return Reader(name, READ_METHOD, field.method_name, field, None)
    attrs = tuple(field.source_attrs)
    if cls is relations.PrimaryKeyRelatedField and field.pk_field is None and len(attrs) == 1:
        return Reader(name, READ_PK, attrs[0], field, None)
    if cls in _READ_FIELDS and attrs and not (cls is drf_fields.JSONField and field.binary):
        return Reader(name, READ_ATTR, attrs, field, _READ_FIELDS[cls])
    return None


def _representation_plan(serializer: PrototypeFieldsMixin) -> list[Reader] | None:
    """The class's readers, in field order; None where this instance must go DRF's way (a
    subclass that builds its own fields, or fields already taken from this instance, which
    its caller may have changed). A field without a reader is read DRF's way, alone."""
    cls = type(serializer)
    if cls.get_fields is not PrototypeFieldsMixin.get_fields or "fields" in serializer.__dict__:
        return None
    plan: list[Reader] | None = cls.__dict__.get("_representation_plan")
    if plan is None:
        plan = []
        for name, field in serializer._prototypes().items():
            if field.write_only:
                continue
            reader = _reader(name, field)
            plan.append(reader or Reader(name, READ_DRF, None, field, None))
        cls._representation_plan = plan  # type: ignore[attr-defined]
    return plan


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
