"""The refinery: owns the merge queue. A branch submitted for a bead is queued; one merge request per rig at a
time (or a batch) is claimed under the rig's merge lease, replayed onto its target in the rig's clone, gated
(by the refinery itself, or as jobs on the gate runners, several prefixes of a batch at once), and
fast-forwarded onto the target; a failure is retried, sent back to its polecat or escalated.

A rig's queue as a whole pauses (``mq.paused``) when every merge request would meet the same cause (the target
refuses pushes for its own reasons, or a gate fails on the target's tip twice in a row) until ``gt mq resume``.

Shape: ``settings``, ``state``, ``projection``, ``decide`` (submit, done, reject, retry, resume), ``plan`` (pure:
``queue``, which merge requests go next, by score, and their claims; ``settle``, what an outcome of processing
settles, its events and follow-up commands; ``pauses``, when a rig's queue pauses; ``speculation``, which prefixes
of a stack are gated next; ``owed``, what every reconcile owes besides), ``effects`` (``merger``: git and the gates,
run in a thread; ``gate_jobs``: gates as jobs on the runners; ``merge_lease``: the rig's merge lease taken,
renewed, released and checked before a push; ``settling``: a settlement carried out; ``bundles``: a session's
published commits imported; ``runner_beats``: the runners' service heartbeats), ``queries`` (``dispatch``; ``board``:
the runners, the gate jobs, merges per hour and gate minutes per merge), ``service`` (wiring). Running gates
(workspaces, watchers, a gate user) is ``shared.host.gates``, shared with the runners.
"""
