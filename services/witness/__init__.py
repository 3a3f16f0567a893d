"""The witness: owns rigs and polecat sessions. It spawns a session (a git worktree and a tmux pane running the
agent) for each bead slung to its rigs, watches it (tmux, the agent's process, heartbeats, usage), warrants and
kills a stuck one, recovers its work when it dies, cleans up after ``gt done``, and delivers nudges.

Shape: ``settings``, ``state``, ``projection``, ``decide`` (commands on rigs, sessions and nudges), ``plan`` (what
is owed from the state and what was observed, as ``plan.actions``: ``sessions``, ``spawns``, ``endings``,
``nudges``, put together by ``owed``; ``plan.scope`` says which rigs this witness serves, ``plan.liveness`` which
hook leases it renews for busy agents, ``plan.names`` the polecats' names), ``effects`` (``observe`` what the
plan reads, the ``actions`` queue and its workers, the ``executor`` dispatching each action to its job: ``spawn``,
``stop``, ``done``, ``cleanup``, ``nudge``, sharing a ``toolkit``; the agent's ``agent_env``, the runtime set-up,
the pidfd watch, the usage watch, the sessions' logins (``auth``), the ``probes`` run before deciding),
``queries``, ``service`` (wiring).
"""
