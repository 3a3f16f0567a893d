"""The refinery: owns the merge queue. A branch submitted for a bead is queued; one merge request per rig at a
time (or a batch) is claimed under the rig's merge lease, rebased onto its target in a temporary worktree,
gated, and fast-forwarded onto the target; a failure is retried, sent back to its polecat or escalated.

Shape: ``settings``, ``state``, ``projection``, ``decide`` (submit, done, reject, retry), ``plan`` (which merge
requests go next, by score, and what else is owed), ``effects`` (``merger``: git and the gates, run in a
thread; ``gate_user``: gates as another OS user; ``refusals``: what git's refusal of a push means),
``queries``, ``service`` (wiring, and the merge lease and settling steps that still live there).
"""
