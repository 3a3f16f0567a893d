"""The refinery: owns the merge queue. A branch submitted for a bead is queued; one merge request per rig at a
time (or a batch) is claimed under the rig's merge lease, rebased onto its target in a temporary worktree,
gated, and fast-forwarded onto the target; a failure is retried, sent back to its polecat or escalated.

A rig's queue as a whole pauses (``mq.paused``) when every merge request would meet the same cause (the target
refuses pushes for its own reasons, or a gate fails on the target's tip twice in a row) until ``gt mq resume``.

Shape: ``settings``, ``state``, ``projection``, ``decide`` (submit, done, reject, retry, resume), ``plan`` (which
merge requests go next, by score, when a queue pauses, and what else is owed), ``effects`` (``merger``: git and
the gates, run in a thread; ``gate_runs`` and ``gate_watch``: a gate under a watcher that stops it with its
refinery, and the sweep of what a killed one left; ``gate_user``: gates as another OS user; ``refusals``: what
git's refusal of a push means),
``queries``, ``service`` (wiring, and the merge lease and settling steps that still live there).
"""
