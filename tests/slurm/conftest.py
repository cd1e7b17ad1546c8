"""A Slurm-backed pool on the throwaway cluster scripts/test.sh starts (scripts/test-slurm.sh):
nodes gpu-a and gpu-b with four A100 GRES each, accounting in slurmdbd, QOS low/normal/high/
urgent preempting scavenger (requeue)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler.backends.slurm import accounts
from scheduler.backends.slurm.client import Cluster
from scheduler.backends.slurm.models import SlurmPool
from scheduler.backends.slurm.nodes import sync_nodes
from scheduler.backends.slurm.sync import sync_pool
from scheduler.models import Job, Pool
from scheduler.seed import catalog_seed


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    here = Path(__file__).parent
    skip = None
    if not os.environ.get("PORTAL_TEST_SLURM"):
        why = os.environ.get("PORTAL_TEST_SLURM_SKIP") or (
            "no throwaway Slurm cluster: run through scripts/test.sh (make test), which starts one"
        )
        skip = pytest.mark.skip(reason=f"Slurm: {why}")
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.slurm)
            if skip is not None:
                item.add_marker(skip)


def cluster() -> Cluster:
    return Cluster(conf_path=os.environ["SLURM_CONF"])


def slurm(*args: str) -> str:
    """A Slurm command run as an operator would (for checks and for work submitted directly)."""
    return cluster().run(list(args)).stdout


def _cluster_name() -> str:
    for line in Path(os.environ["SLURM_CONF"]).read_text().splitlines():
        if line.startswith("ClusterName="):
            return line.split("=", 1)[1].strip()
    raise AssertionError("no ClusterName")


def _clean_cluster() -> None:
    subprocess.run(
        ["scancel", "--full", "--quiet", "--user=root"],
        env=cluster().env(),
        check=False,
        capture_output=True,
    )
    for node in ("gpu-a", "gpu-b"):
        cluster().run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)
    # wait until Slurm has let go of every job: the next test starts on an empty cluster
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and cluster().run(["squeue", "-h"]).stdout.strip():
        time.sleep(0.2)


@pytest.fixture
def slurm_pool(db: None) -> Iterator[Pool]:
    catalog_seed()
    _clean_cluster()
    accounts.forget_cache()  # each test writes its project's limits afresh
    pool = Pool.objects.create(name="hpc", backend=Pool.Backend.SLURM)
    SlurmPool.objects.create(
        pool=pool,
        cluster_name=_cluster_name(),
        conf_path=os.environ["SLURM_CONF"],
        partitions="gpu",
        gpu_types={"A100-80GB": "a100"},
        output_dir=os.environ["PORTAL_TEST_SLURM_SHARED"],
    )
    sync_nodes(pool)
    yield pool
    _clean_cluster()


@pytest.fixture
def wait_for(slurm_pool: Pool) -> Callable[..., Job]:
    """Sync the pool until `job` satisfies `check` (Slurm's scheduler runs every second)."""

    def wait(job: Job, check: Callable[[Job], bool], timeout: float = 45) -> Job:
        deadline = time.monotonic() + timeout
        while True:
            sync_pool(slurm_pool)
            job.refresh_from_db()
            if check(job):
                return job
            if time.monotonic() > deadline:
                link = getattr(job, "slurm", None)
                raise AssertionError(
                    f"job {job.pk} is {job.state} ({job.pending_message or job.failure_reason}); "
                    f"Slurm: {link and link.state} {link and link.reason}"
                )
            time.sleep(0.3)

    return wait
