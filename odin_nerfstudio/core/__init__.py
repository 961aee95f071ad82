"""Plain types and pure ops every layer shares: tasks, cameras, sparse updates, per-primitive tables, conflict checks, selective Adam, the timeline, row order."""
