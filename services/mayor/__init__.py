"""The mayor: owns the town's work. Beads (create, update, claim, close, dependencies), molecules (a formula
cooked into steps when a bead is slung to a rig), convoys, mail (beads of type ``message``) and escalations; it
answers their queries and ``gt costs``. What it owes unasked (``plan``): slinging held beads whose blockers
closed, closing finished convoys, re-escalating ignored escalations.

Shape: ``state`` (the data, and pure reads of it shared by decide, plan and queries), ``projection`` (the fold),
``decide`` (one module per area: beads, convoys, escalations, mail, work), ``plan``, ``queries`` (with
``queries.costs``), ``effects`` (reading formula files: a sling's formula is looked up in ``prepare()`` and
handed to decide, which does no I/O; the formula queries), ``service`` (wiring). It has no ``settings`` module:
its one knob, how long an escalation may go unacknowledged (``GT_ESCALATION_STALE_AFTER``), is town
configuration (``shared.core.config``).
"""
