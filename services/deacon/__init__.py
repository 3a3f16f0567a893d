"""The deacon: owns the town's housekeeping. It records which services are up or down (from their heartbeats)
and escalates one down too long, grants and expires TTL leases, hands stale hooks to the witness, raises the
disk-space alarm, sweeps the projections and KV buckets of dead things (``gc.swept``), and runs the operator's
automations (``GT_HOME/automations/*.toml``).

Shape, as the other services: ``settings``, ``state`` (every part of what it knows), ``projection`` (their
folds), ``decide`` (lease acquire and release, an automation's manual run, a sweep), ``plan`` (what is owed, one
pure module per concern: ``liveness``, ``hooks``, ``gc``, ``disk``), ``effects`` (the watch's pass,
``housekeeping``; the KV watches of heartbeats and leases, the KV sweep, the disk measurements, the stream scans
of event gates), ``queries`` (``gt.q.deacon.*``), ``automations`` (a sub-package laid out the same way:
``definitions`` read from the files, ``state``, ``projection``, ``plan``, ``queries``, and the ``runner`` and
``shell`` that carry runs out), ``service`` (wiring: the watch is the base service's ``tick``).
"""
