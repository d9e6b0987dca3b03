"""The planner: partition snapshots and a feed's policy in, a plan (offset ranges per partition) out."""
