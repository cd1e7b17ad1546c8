"""The planner's collaborators, one concern each; `scheduler.core.plan` drives them.

- `decisions`: the policy and what a plan decides (placements, preemptions, ...)
- `context`: what the collaborators share in one pool's cycle, and the bookkeeping types
- `caches`: the per-cycle caches, each typed and invalidated when the cluster state changes
- `search`: request masks and placement search (one node, a gang, spread over nodes)
- `quota`: quota admission and usage accounting, other projects' reserved capacity
- `estimates`: the release timeline and estimated starts
- `reservations`: the head job's reservation and EASY backfill around it
- `preemption`: choosing victims
- `elastic`: shrinking elastic work for a waiting job, growing it into idle GPUs
"""
