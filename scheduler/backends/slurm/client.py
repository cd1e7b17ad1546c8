"""Runs Slurm's commands for one cluster and parses their answers.

Reads use `--json` where Slurm 22.05 offers it (squeue, sacct, sinfo; its scontrol has none); sbatch
answers `--parsable` ("<id>[;cluster]"), sbatch --test-only a line on stderr, sacctmgr
`--parsable2`. Each call sees only the pool's slurm.conf (SLURM_CONF), which names the
controller and the munge socket; nothing else of the portal's environment leaks to the commands.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

TIMEOUT_S = 30


class SlurmError(Exception):
    """A Slurm command failed; the message is Slurm's own words."""


@dataclass(frozen=True)
class Cluster:
    """What a command needs to reach a cluster."""

    conf_path: str
    name: str = ""

    def env(self) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ")}
        keep.setdefault("PATH", "/usr/bin:/bin:/usr/sbin:/sbin")
        return {**keep, "SLURM_CONF": self.conf_path, "SLURM_TIME_FORMAT": "standard"}

    def run(
        self, args: Sequence[str], *, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        try:
            proc = subprocess.run(  # noqa: S603 - a fixed Slurm command, no shell
                list(args),
                input=stdin,
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
                env=self.env(),
                check=False,
            )
        except FileNotFoundError as exc:
            raise SlurmError(f"{args[0]} is not installed on the portal's host") from exc
        except subprocess.TimeoutExpired as exc:
            raise SlurmError(f"{args[0]} did not answer in {TIMEOUT_S} s") from exc
        if check and proc.returncode != 0:
            words = (proc.stderr or proc.stdout).strip().splitlines()
            raise SlurmError(words[-1] if words else f"{args[0]} failed ({proc.returncode})")
        return proc

    def json(self, args: Sequence[str]) -> dict[str, Any]:
        out = self.run([*args, "--json"]).stdout
        try:
            data: dict[str, Any] = json.loads(out)
        except ValueError as exc:
            raise SlurmError(f"{args[0]} --json did not answer JSON") from exc
        errors = data.get("errors") or []
        if errors:
            first = errors[0]
            raise SlurmError(str(first.get("error") or first.get("description") or first))
        return data

    # ---- reads ----
    def squeue(self, job_ids: Sequence[str] | None = None) -> list[dict[str, Any]]:
        args = ["squeue", "--all"]
        if job_ids:
            args += ["--jobs", ",".join(job_ids)]
        jobs: list[dict[str, Any]] = self.json(args).get("jobs", [])
        return jobs

    def sacct(
        self, *, start: str, end: str, job_ids: Sequence[str] | None = None
    ) -> list[dict[str, Any]]:
        args = ["sacct", "--allusers", "--duplicates", "--starttime", start, "--endtime", end]
        if job_ids:
            args += ["--jobs", ",".join(job_ids)]
        jobs: list[dict[str, Any]] = self.json(args).get("jobs", [])
        return jobs

    def nodes(self) -> list[dict[str, Any]]:
        # 22.05's scontrol has no --json; sinfo --json carries the same node records
        nodes: list[dict[str, Any]] = self.json(["sinfo"]).get("nodes", [])
        return nodes

    # ---- writes ----
    def sbatch(self, args: Sequence[str], script: str) -> str:
        out = self.run(["sbatch", "--parsable", *args], stdin=script).stdout.strip()
        return out.split(";", 1)[0]

    def sbatch_test_only(self, args: Sequence[str], script: str) -> str:
        proc = self.run(["sbatch", "--test-only", *args], stdin=script, check=False)
        words = (proc.stderr or proc.stdout).strip()
        if proc.returncode != 0:
            raise SlurmError(words.splitlines()[-1] if words else "sbatch --test-only failed")
        return words.removeprefix("sbatch: ").strip()

    def scancel(self, job_id: str) -> None:
        self.run(["scancel", job_id])

    def scontrol_update_node(self, name: str, state: str, reason: str = "") -> None:
        args = ["scontrol", "update", f"NodeName={name}", f"State={state}"]
        if reason:
            args.append(f"Reason={reason}")
        self.run(args)

    def sacctmgr(self, *args: str, check: bool = True) -> str:
        return self.run(["sacctmgr", "--immediate", "--parsable2", *args], check=check).stdout


def cluster_for(pool: Any) -> Cluster:
    """The Cluster of a pool whose backend is Slurm (its SlurmPool row)."""
    cfg = pool.slurm
    return Cluster(conf_path=cfg.conf_path, name=cfg.cluster_name)
