"""What the witness owes, computed from its projection and what it observed (tmux, processes, heartbeats).

Pure and level-triggered: the same state and observation give the same actions, whoever crashed when. The
executor (``effects/executor.py``) carries them out; after each, the next plan sees the new state.

The parts: ``observed`` (what was seen) and ``policy`` (the knobs) go in; ``sessions`` judges the sessions that
hold a hook, ``spawns`` the beads that need one, ``endings`` what an ended session leaves (and mass deaths,
orphans), ``nudges`` the nudges and mail owed; ``owed.plan`` puts them together, as ``actions``. Beside them:
``scope`` (which rigs this witness serves), ``liveness`` (hook leases renewed for busy agents), ``names``.
"""

from services.witness.plan.observed import Observed, PaneSeen, pane_of
from services.witness.plan.owed import plan
from services.witness.plan.policy import Policy
from services.witness.plan.sessions import AGENT_UNAUTHORIZED, last_sign_of_life
from services.witness.plan.spawns import (
    last_words,
    needs_session,
    respawn_due,
    session_id_for,
    tmux_name_for,
)
from shared.model.events.beads import WORKING
from shared.model.sessions import may_linger

__all__ = [
    "AGENT_UNAUTHORIZED",
    "WORKING",
    "Observed",
    "PaneSeen",
    "Policy",
    "last_sign_of_life",
    "last_words",
    "may_linger",
    "needs_session",
    "pane_of",
    "plan",
    "respawn_due",
    "session_id_for",
    "tmux_name_for",
]
