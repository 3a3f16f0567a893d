"""The deacon's automations (docs/automations.md): operator files ``GT_HOME/automations/<name>.toml`` that fire
on a schedule, an event or a condition and run a command or a formula.

Laid out like a service: ``definitions`` (the files, parsed and checked; ``cron`` their schedules), ``state``
(what the log says about them) and ``projection`` (its fold), ``plan`` (which are due, what each open run owes;
the manual run's decision), ``queries`` (``gt.q.deacon.automations``), and the ``runner`` (the adapter the
deacon's service drives) with ``shell`` (running an exec action or a check)."""
