"""What the deacon owes, one pure module per concern, each with its part of the state and its fold: service
``liveness`` (up, down, escalated), TTL ``leases`` (expiry; acquire and release are decided here too), stale
``hooks``, garbage collection (``gc``: when a sweep is due, what it drops) and the ``disk`` alarm."""
