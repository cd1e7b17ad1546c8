"""Seed the catalog, a small simulated fleet, an operator and a researcher with two projects
(one with a shared volume and a small dataset)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand
from django.db import transaction

from portal.models import Membership, Project, Role, User
from portal.services import project_create
from scheduler.models import Gpu, GpuModel, Node, Pool, QuotaModelLimit
from scheduler.nodes import node_issue_agent_token
from scheduler.seed import catalog_seed, node_register_simulated
from storage.datasets import dataset_upload_chunk, dataset_upload_start
from storage.models import Volume
from storage.services import volume_create

DEMO_USERS = {
    "operator": ("operator@gpucloud.example", "operator-demo-pass", "Olga Operator", True),
    "researcher": (
        "researcher@gpucloud.example",
        "researcher-demo-pass",
        "Rafael Researcher",
        False,
    ),
    "colleague": ("colleague@gpucloud.example", "colleague-demo-pass", "Chen Colleague", False),
}

DEMO_FLEET = [
    # name, model, gpus, sharing, oversubscription
    ("sim-h100-01", "H100-80GB-SXM", 8, Gpu.SharingMode.EXCLUSIVE, 1),
    ("sim-h100-02", "H100-80GB-SXM", 8, Gpu.SharingMode.EXCLUSIVE, 1),
    ("sim-a100-01", "A100-80GB", 4, Gpu.SharingMode.EXCLUSIVE, 1),
    ("sim-l40s-01", "L40S", 4, Gpu.SharingMode.MPS, 1),
    ("sim-l4-01", "L4", 4, Gpu.SharingMode.TIME_SLICE, 2),
    ("sim-t4-01", "T4", 4, Gpu.SharingMode.TIME_SLICE, 2),
]


class Command(BaseCommand):
    help = "Seed demo data (idempotent): catalog, simulated fleet, demo accounts and projects."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--agent-tokens",
            metavar="DIR",
            help="Issue fresh agent tokens for the simulated nodes and write them to DIR "
            "(one <node>.token file each, mode 0600, plus agents.tsv: node, GPUs).",
        )

    @transaction.atomic
    def handle(self, *args: Any, **options: Any) -> None:
        created = catalog_seed()
        users = {}
        for key, (email, password, name, staff) in DEMO_USERS.items():
            user = User.objects.filter(email=email).first()
            if user is None:
                user = User.objects.create_user(
                    email, password, full_name=name, is_staff=staff, is_superuser=staff
                )
            users[key] = user

        pool, _ = Pool.objects.get_or_create(
            name="default", defaults={"description": "Simulated demo fleet"}
        )
        for name, model_name, count, sharing, factor in DEMO_FLEET:
            node_register_simulated(
                name=name,
                pool=pool,
                gpu_model=GpuModel.objects.get(name=model_name),
                gpu_count=count,
                cpu_milli=count * 16_000,
                memory_mib=count * 128 * 1024,
                sharing_mode=sharing,
                oversubscription=factor,
            )

        researcher, colleague = users["researcher"], users["colleague"]
        if not Project.objects.filter(slug="vision-lab").exists():
            vision = project_create(
                owner=researcher,
                slug="vision-lab",
                name="Vision Lab",
                description="Image models: training on H100s, inference experiments on L4s.",
            )
            vision.quota.max_gpus = 16
            vision.quota.gpu_hours_per_month = 2000
            vision.quota.save()
            QuotaModelLimit.objects.create(
                quota=vision.quota, gpu_model=GpuModel.objects.get(name="H100-80GB-SXM"), max_gpus=8
            )
            Membership.objects.create(project=vision, user=colleague, role=Role.MEMBER)
        if not Project.objects.filter(slug="nlp-lab").exists():
            nlp = project_create(
                owner=colleague,
                slug="nlp-lab",
                name="NLP Lab",
                description="Language model fine-tuning.",
            )
            nlp.quota.max_gpus = 8
            nlp.quota.gpu_hours_per_month = 500
            nlp.quota.save()
            Membership.objects.create(project=nlp, user=researcher, role=Role.MEMBER)

        self._seed_storage(Project.objects.get(slug="vision-lab"), researcher)

        if options.get("agent_tokens"):
            self._write_agent_tokens(Path(options["agent_tokens"]))
        self.stdout.write(self.style.SUCCESS(f"Demo data ready ({created} GPU models added)."))
        for key, (email, password, _, staff) in DEMO_USERS.items():
            kind = "operator, staff" if staff else "researcher"
            self.stdout.write(f"  {key:<10} {email:<32} password: {password}  ({kind})")

    def _seed_storage(self, project: Project, owner: User) -> None:
        """A shared checkpoint volume and a small dataset (a CSV written through the upload
        service, so it lands under STORAGE_SHARED_ROOT/v<id>/ with its checksum)."""
        if Volume.objects.filter(project=project).exists():
            return
        volume_create(actor=owner, project=project, name="checkpoints", kind="shared", size_gib=50)
        dataset = volume_create(
            actor=owner, project=project, name="iris", kind="shared", size_gib=1, is_dataset=True
        )
        rows = "sepal_length,sepal_width,petal_length,petal_width,species\n" + "".join(
            f"{5 + i % 3}.{i % 10},{3 + i % 2}.{i % 7},{1 + i % 5}.{i % 4},0.{i % 9},setosa\n"
            for i in range(150)
        )
        data = rows.encode()
        dataset = dataset_upload_start(
            actor=owner, volume=dataset, file_name="iris.csv", size_bytes=len(data)
        )
        dataset_upload_chunk(actor=owner, volume=dataset, offset=0, data=data)

    def _write_agent_tokens(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        lines = []
        for name, model_name, count, _, _ in DEMO_FLEET:
            node = Node.objects.get(name=name)
            token = node_issue_agent_token(node=node)
            path = folder / f"{name}.token"
            path.touch(mode=0o600)
            path.chmod(0o600)
            path.write_text(token)
            lines.append(f"{name}\t{count}x{model_name}\n")
        (folder / "agents.tsv").write_text("".join(lines))
