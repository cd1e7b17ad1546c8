"""Reading a manifest safely, and checking it against the Kubernetes batch/v1 Job schema.

YAML is read without aliases or anchors (refused at the first event that carries one, before
anything is composed: nested aliases are how a few hundred bytes expand to gigabytes) and no
deeper than `MAX_DEPTH`. The schema is the strict JSON schema of Kubernetes `SCHEMA_VERSION`
bundled with the pinned `kubernetes-validate` package, read from disk (no network), once.
"""

from __future__ import annotations

import functools
from typing import Any

import jsonschema
import yaml
from kubernetes_validate.utils import schema_contents
from referencing import Registry, Resource

MAX_MANIFEST_BYTES = 256 * 1024
MAX_DEPTH = 64
SCHEMA_VERSION = "1.33.0"
API_VERSION, KIND = "batch/v1", "Job"


class ManifestYamlError(ValueError):
    """The text is not a plain YAML document we read: says why, in one line."""


class _PlainLoader(yaml.SafeLoader):
    """A safe loader that refuses anchors and aliases before composing, and deep nesting."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:  # type: ignore[override]
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise ManifestYamlError(
                f"YAML aliases (*{event.anchor}) are not accepted; write the value out."
            )
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            raise ManifestYamlError(
                f"YAML anchors (&{anchor}) are not accepted; write the value out."
            )
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise ManifestYamlError(f"nested deeper than {MAX_DEPTH} levels.")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load_yaml(text: str) -> Any:
    """One YAML document, without aliases or anchors; ManifestYamlError says what is wrong."""
    loader = None
    try:
        loader = _PlainLoader(text)  # the reader checks the characters here already
        return loader.get_single_data()
    except ManifestYamlError:
        raise
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ManifestYamlError(f"is not valid YAML ({first}).") from None
    except (RecursionError, ValueError, TypeError, OverflowError) as exc:
        raise ManifestYamlError(f"cannot be read as YAML ({type(exc).__name__}).") from None
    finally:
        if loader is not None:
            loader.dispose()


@functools.cache
def _job_validator() -> jsonschema.protocols.Validator:
    folder = f"kubernetes-json-schema/v{SCHEMA_VERSION}-local-strict"
    schema = schema_contents(f"{folder}/job-batch-v1.json", SCHEMA_VERSION)
    definitions = schema_contents(f"{folder}/_definitions.json", SCHEMA_VERSION)
    registry: Registry[Any] = Registry()
    registry = Resource.from_contents(schema) @ registry
    registry = Resource.from_contents(definitions) @ registry
    validator: jsonschema.protocols.Validator = jsonschema.validators.Draft202012Validator(
        schema, registry=registry
    )
    return validator


def _path(parts: Any) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def schema_errors(doc: dict[str, Any]) -> list[dict[str, str]]:
    """Every place the document breaks the batch/v1 Job schema: [{"field", "why"}], by path."""
    found: dict[str, str] = {}
    for error in _job_validator().iter_errors(doc):
        field = _path(error.absolute_path) or "manifest"
        if error.validator == "additionalProperties" and isinstance(error.instance, dict):
            allowed = set(error.schema.get("properties", {}))
            for key in error.instance:
                if key not in allowed:
                    sub = f"{field}.{key}" if field != "manifest" else str(key)
                    found.setdefault(
                        sub, f"is not a field of a Kubernetes {SCHEMA_VERSION} batch/v1 Job."
                    )
            continue
        if error.validator == "oneOf" and error.context:
            message = "; or ".join(sorted({e.message for e in error.context}))
        else:
            message = error.message
        found.setdefault(field, f"breaks the Kubernetes schema: {message[:200]}")
        if len(found) >= 50:
            break
    return [{"field": f, "why": w} for f, w in sorted(found.items())]
