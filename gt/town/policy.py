"""The town's order of start and stop, its crash-loop limits and its waits (``gt up``, ``gt down``)."""

from __future__ import annotations

START_ORDER = ("mayor", "witness", "refinery", "deacon")
"""Dependency order: services start in this order."""
STOP_ORDER = ("refinery", "witness", "mayor", "deacon")
"""Merges and sessions stop first, the mayor after them (it answers their last commands), the deacon last
(it records the others stopping); then NATS. Gate runners stop right after the refinery (``stop_rank``)."""
RUNNER = "runner"
"""The gate runners' service (``services.runner``); `gt up --runners N` starts runner-1 ... runner-N."""
MAX_RUNNERS = 64


def runner_names(count: int) -> list[str]:
    """The children of `gt up --runners count`: ``runner-1`` ... (``GT_RUNNER_NAME`` 1 ...)."""
    return [f"{RUNNER}-{n}" for n in range(1, count + 1)]


def module_of(child: str) -> str:
    """The service a child runs (``python -m services.<module>``): a runner's is ``runner``."""
    return RUNNER if child.startswith(f"{RUNNER}-") else child


def start_rank(child: str) -> int:
    """Where a child starts: in ``START_ORDER``, the gate runners after the refinery (they take its jobs)."""
    module = module_of(child)
    return START_ORDER.index("refinery") if module == RUNNER else START_ORDER.index(module)


def stop_rank(child: str) -> int:
    """Where a child stops: in ``STOP_ORDER``, the gate runners right after the refinery. The refinery first stops
    asking for gates; a job a runner finishes meanwhile is in the log, and the next refinery adopts its answer."""
    module = module_of(child)
    return STOP_ORDER.index("refinery") if module == RUNNER else STOP_ORDER.index(module)


CRASH_LOOP_RESTARTS = 5
CRASH_LOOP_WINDOW_S = 15 * 60
MAX_BACKOFF_S = 30.0
READY_TIMEOUT_S = 120.0
DOWN_TIMEOUT_S = 90.0
DEFAULT_TMUX_SOCKET = "gastown"
"""As the witness's (services.witness.settings): the CLI does not import a service."""
POLECAT_TMUX_PREFIX = "gt-"
"""Polecat tmux sessions are named ``gt-<rig>-<polecat>`` (services.witness.plan.scope)."""
NATS = "nats"
"""The embedded nats-server's name in ``town.json``'s ``gave_up`` and in crash-loop escalations."""
HUNG_CONFIRM_S = 2.0
"""A service recorded down whose process runs is killed as hung once it did not beat this long after we learnt."""
OUTAGE_GRACE_S = 10.0
"""Nor before this long after the supervisor's connection to NATS came back: every service was silent meanwhile."""
HEALTH_PATIENCE_S = 10.0
"""How long ``gt up -d`` on a running town waits for it to be healthy before it says what is wrong: a child
restarted a moment ago is back within a few seconds."""
