"""Projects → Slurm accounts; quotas → association limits (sacctmgr), so that a project's
limits hold even for work submitted to Slurm directly. The portal's admission still answers
first with its own reasons; Slurm's limits are the floor under it.

- account name = the project's slug; the portal's submit user gets an association in it with
  every QOS of the pool;
- Quota.max_gpus → GrpTRES=gres/gpu=N (blank: -1, no limit);
- each per-model limit → GrpTRES=gres/gpu:<type>=N for the model's GRES type;
- Quota.max_gpus_per_job → MaxTRESPerJob=gres/gpu=N (a bigger job waits in Slurm with
  `AssocMaxGRESPerJob`).
Fair share needs nothing more: one account per project gives every project its own
association, and Slurm's fair-share factor weighs each account's usage against its shares.
"""

from __future__ import annotations

from portal.models import Project
from scheduler.backends.slurm.client import Cluster, SlurmError, cluster_for
from scheduler.backends.slurm.models import SlurmPool
from scheduler.models import Quota

_known: set[tuple[str, str]] = set()  # (conf, account) made in this process


def _qos_list(cfg: SlurmPool) -> str:
    names = {cfg.preemptible_qos, *map(str, cfg.qos_by_priority.values())}
    return ",".join(sorted(n for n in names if n))


def ensure_account(cfg: SlurmPool, project: Project) -> None:
    """The project's account and the submit user's association exist (idempotent, cached)."""
    key = (cfg.conf_path, project.slug)
    if key in _known:
        return
    cluster = cluster_for(cfg.pool)
    existing = cluster.sacctmgr("show", "assoc", "format=account,user", f"account={project.slug}")
    users = {line.split("|")[1] for line in existing.splitlines()[1:] if "|" in line}
    if not existing.splitlines()[1:]:
        cluster.sacctmgr(
            "add", "account", project.slug, f"Description=portal project {project.slug}"[:100]
        )
    if cfg.submit_user not in users:
        cluster.sacctmgr(
            "add",
            "user",
            cfg.submit_user,
            f"account={project.slug}",
            f"qos={_qos_list(cfg)}",
            f"defaultqos={cfg.qos_by_priority.get('1', 'normal')}",
        )
    _known.add(key)
    sync_limits(cfg, project)


def forget_cache() -> None:
    _known.clear()


def grp_tres(cfg: SlurmPool, quota: Quota | None) -> str:
    """The GrpTRES value for a quota: `gres/gpu=N[,gres/gpu:<type>=M…]`, -1 for unlimited."""
    total = quota.max_gpus if quota is not None and quota.max_gpus is not None else -1
    parts = [f"gres/gpu={total}"]
    limits = {}
    if quota is not None and quota.pk:
        for limit in quota.model_limits.select_related("gpu_model"):
            kind = cfg.gpu_types.get(limit.gpu_model.name)
            if kind:
                limits[kind] = limit.max_gpus
    for kind in sorted(set(map(str, cfg.gpu_types.values()))):
        parts.append(f"gres/gpu:{kind}={limits.get(kind, -1)}")
    return ",".join(parts)


def max_tres_per_job(quota: Quota | None) -> str:
    """The MaxTRESPerJob value for a quota: `gres/gpu=N`, -1 for unlimited."""
    return f"gres/gpu={quota.max_gpus_per_job if quota is not None else -1}"


def sync_limits(cfg: SlurmPool, project: Project) -> str:
    """Write the project's quota as the account's GrpTRES and MaxTRESPerJob. Returns the
    GrpTRES value written."""
    quota = Quota.objects.filter(project=project).first()
    value = grp_tres(cfg, quota)
    cluster = cluster_for(cfg.pool)
    cluster.sacctmgr(
        "modify",
        "account",
        project.slug,
        "set",
        f"GrpTRES={value}",
        f"MaxTRESPerJob={max_tres_per_job(quota)}",
    )
    return value


def account_limits(cluster: Cluster, account: str, limit: str = "grptres") -> str:
    """One of the account's limits as Slurm holds it (`grptres`, `maxtres`: its
    MaxTRESPerJob), for pages and tests."""
    out = cluster.sacctmgr("show", "assoc", f"format=account,user,{limit}", f"account={account}")
    for line in out.splitlines()[1:]:
        acct, user, tres = [*line.split("|"), "", "", ""][:3]
        if acct == account and not user:
            return tres
    raise SlurmError(f"no Slurm account {account}")


def sync_project_limits(project_id: int) -> int:
    """The project's limits in every Slurm pool where it has an account. Returns how many."""
    project = Project.objects.filter(pk=project_id).first()
    if project is None:
        return 0
    count = 0
    for cfg in SlurmPool.objects.select_related("pool"):
        try:
            out = cluster_for(cfg.pool).sacctmgr("show", "account", project.slug, "format=account")
            if len(out.strip().splitlines()) < 2:  # the header alone
                continue  # no work of it went to this cluster yet: made at its first submit
            sync_limits(cfg, project)
            count += 1
        except SlurmError:
            continue
    return count


def sync_all_limits() -> int:
    """Every project with Slurm work in each Slurm pool gets its limits rewritten."""
    from scheduler.backends.slurm.models import SlurmJob

    count = 0
    for cfg in SlurmPool.objects.select_related("pool"):
        slugs = set(
            SlurmJob.objects.filter(pool=cfg.pool).values_list("job__project__slug", flat=True)
        )
        for project in Project.objects.filter(slug__in=slugs):
            try:
                sync_limits(cfg, project)
                count += 1
            except SlurmError:
                continue
    return count
