"""The planner's knobs (from ``WitnessSettings``), one frozen value handed to every part of the plan."""

from __future__ import annotations

import msgspec


class Policy(msgspec.Struct, frozen=True, kw_only=True):
    rigs_root: str
    """Directory holding one directory per rig (GT_HOME/rigs)."""
    min_orphan_age_s: float = 60.0
    done_stuck_after_s: float = 60.0
    done_exit_grace_s: float = 60.0
    """An agent still running after `gt done` ended its session is left this long to see the result."""
    mass_death_count: int = 3
    mass_death_window_s: float = 30.0
    respawn_backoff_s: float = 5.0
    respawn_backoff_max_s: float = 300.0
    respawn_backoff_reset_s: float = 300.0
    """See ``WitnessSettings`` (``GT_RESPAWN_BACKOFF*``) and ``respawn_due``."""
    max_start_failures: int = 3
    start_confirm_s: float = 120.0
    """A runtime that confirms its start (a hook) and did not within this long after its pane started has failed
    to start (``GT_AGENT_START_TIMEOUT``)."""
    rigs: frozenset[str] | None = None
    """The witness's scope (``GT_WITNESS_RIGS``): it acts only for these rigs; None: for all."""
    gate_quiet_s: float = 30.0
    """A session whose bead's current step waits on its gate is ended once its agent has been quiet this long
    (``GT_GATE_QUIET``)."""
    context_handoff_at: tuple[float, ...] = ()
    """Shares of the context window at which a session is told to hand off (``GT_CONTEXT_HANDOFF``)."""
