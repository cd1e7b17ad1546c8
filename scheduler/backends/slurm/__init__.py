"""Slurm-backed pools: the portal fronts a Slurm cluster through its commands (see docs/slurm.md).

client.py   runs sbatch/squeue/sacct/scancel/scontrol/sacctmgr for a pool, JSON where 22.05 has it
submit.py   our job → an sbatch command line; the cycle's hand-off; cancel; dry run (--test-only)
sync.py     Slurm job states and pending reasons → ours, in words (the periodic task)
logs.py     a job's log = its output file on the shared filesystem
views.py    ops: drain/resume a Slurm node
nodes.py    sinfo --json → mirrored Node/Gpu rows; drain and resume (scontrol update)
accounts.py quotas → Slurm accounts and associations with GRES limits (sacctmgr)

Billing's side is billing/slurm.py: sacct → allocations → the ledger (usage_meter).
"""
