"""GPU catalog, inventory, jobs and the scheduling cycle; `scheduler.core` is the pure planner."""
