"""The deacon: owns the town's housekeeping. It records which services are up or down (from their heartbeats)
and escalates one down too long, grants and expires TTL leases, hands stale hooks to the witness, raises the
disk-space alarm, sweeps the projections and KV buckets of dead things (``gc.swept``), and runs the operator's
automations (``GT_HOME/automations/*.toml``).

Shape: ``settings``, ``state``, ``projection``, ``decide`` (lease acquire and release, an automation's manual
run, a sweep), ``plan`` (what is owed, one module per concern: ``liveness``, ``leases``, ``hooks``, ``gc``,
``disk``), ``effects`` (the KV watches of heartbeats and leases, the KV sweep, the disk measurements, the
stream scans of event gates), ``automations`` (a sub-package laid out the same way: ``definitions`` read from
the files, ``state``, ``plan``, ``queries``, and the ``runner`` and ``shell`` that carry runs out), ``service``
(wiring; it has no ``queries`` module of its own yet: its few answers are in ``service.query``).
"""
