"""Running a rig's gates on a commit: adapters shared by the refinery (gates in its own process) and the gate
runners (``gt-runner``). ``workspace`` (a persistent workspace checked out at a commit, repaired of a crash's
leftovers), ``user`` (gates as another OS user, in that user's workspaces), ``runs`` (a gate under a watcher that
never outlives its starter), ``watch`` (the watcher), ``execution`` (one probe: every gate of a rig on one commit)."""
