"""The domain model: events, commands, queries, formulas, statuses and the pure rules around them.
No I/O; imports only ``shared.core`` and itself."""
