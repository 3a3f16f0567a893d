"""What ``gt prime`` tells a polecat session, as one document: ``gt prime --json`` prints it, its text view is
made from it, the Stop hook reads it, and the reference agent (``gt.agent``) reads it back into this class. Pure
data, built from the witness's session and the mayor's bead, molecule and mail as of one moment of the log."""

from __future__ import annotations

import msgspec

from shared.model.beads import Bead, BeadDetail
from shared.model.events.sessions import SessionStatus
from shared.model.molecules import MoleculeView, Step
from shared.model.rigs import Rig
from shared.model.sessions import EarlierSession, MergeFailure


class Prime(msgspec.Struct, kw_only=True, gc=False):
    session: str
    status: SessionStatus
    attempt: int
    polecat: str
    rig: Rig | None
    """The rig's settings (its gates, its base branch); None when the witness no longer knows the rig."""
    worktree: str
    branch: str
    bead: BeadDetail
    molecule: MoleculeView | None
    """None: the bead has no molecule, and is worked as one step."""
    current_step: Step | None
    """The molecule's step to work now; None when every one is done (or there is no molecule)."""
    done_intent: bool
    """`gt done` already began for this session."""
    merge_failure: MergeFailure | None
    """Why the merge queue last sent the bead's work back."""
    nudges: list[str]
    """What was nudged to this session."""
    before_you: list[EarlierSession]
    """How the bead's earlier sessions ended, newest first."""
    mail: list[Bead]
    """Unread messages to the polecat."""
    instructions: str
