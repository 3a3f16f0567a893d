"""What the deacon owes, one pure module per concern: service ``liveness`` (up, down, escalated), stale
``hooks`` (which to hand to the witness), garbage collection (``gc``: when a sweep is due, what it drops) and
the ``disk`` alarm. Their state is in ``state``, its folds in ``projection``; a lease's expiry is decided on
the one lease record (``shared.model.leases.due_to_expire``)."""
