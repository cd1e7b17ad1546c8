"""Kubernetes batch/v1 Job manifests: imported field by field (`parse`), exported (`export`)."""

from scheduler.manifests.export import job_manifest, job_manifest_yaml
from scheduler.manifests.parse import ManifestImport, ManifestRefused, parse_manifest

__all__ = [
    "ManifestImport",
    "ManifestRefused",
    "job_manifest",
    "job_manifest_yaml",
    "parse_manifest",
]
