"""The `gt done` saga, written once: its steps' commands and their ids.

An agent's `gt done` (``gt/cli/polecats.py``) runs it: the done-intent (the witness records it, so a death from
here on is finished, not re-run), the branch published as a bundle (``git.publish``, into ``published_dir``), the
merge request (the refinery), the finish (the witness ends the session). An agent that dies or hangs after its
done-intent has the witness finish it (``services/witness/effects/done.py``): the same bundle folder and the same
merge request, so either side's step, sent twice, is one command.

Each id is fixed by the session (and the published head), so a rerun after a crash resends the same commands.
``secret``: the sending session's password keys the ids (``ids.keyed_id``), so no other session can send one of
them first; None (the witness, or a town without per-session identities) leaves them as they are. Pure: no I/O.
"""

from __future__ import annotations

from pathlib import Path

from shared.core.ids import keyed_id
from shared.model.commands import Fence, MergeRequestDone, SessionDoneIntentCmd, SessionFinish
from shared.model.crew import crew_of_branch, crew_publisher


def intent_id(session: str) -> str:
    """The command id of the session's done-intent."""
    return f"done-intent-{session}"


def merge_request_id(session: str, head: str) -> str:
    """The command id of a session's merge request (`gt done`, or the witness finishing it for the session): the
    same commit submitted twice by either is one command; a new commit (a fix after a refusal) another."""
    return f"mr-{session}-{head[:12]}"


def finish_id(session: str) -> str:
    """The command id of the session's finish."""
    return f"finish-{session}"


def published_dir(rig_dir: Path, session: str) -> Path:
    """Where the session's branch is published (``git.publish``) in its rig's directory (``rigs/<rig home>``): kept
    until its bead is closed; a later session of the bead starts from the newest bundle there."""
    return rig_dir / "published" / session


def publisher(session: str | None, branch: str) -> str:
    """Who published a merge request's bundle, naming its folder (``published_dir``) and where the refinery imports
    it (``git.imported_ref``): its session, or for a crew member's `gt done` the member (``crew_publisher``)."""
    if session:
        return session
    name = crew_of_branch(branch)
    return crew_publisher(name) if name is not None else ""


def intent(session: str, *, secret: str | None = None) -> SessionDoneIntentCmd:
    """Step 1: `gt done` begins."""
    return SessionDoneIntentCmd(session=session, cmd_id=keyed_id(intent_id(session), secret))


def merge_request(
    *,
    session: str,
    bead: str,
    rig: str,
    branch: str,
    head: str,
    bundle: str,
    fence: Fence | None = None,
    secret: str | None = None,
) -> MergeRequestDone:
    """Step 3 (after the branch is published at ``head`` as ``bundle``): submit it to the merge queue. ``fence``:
    the session's hook lease (the witness sends it on the session's behalf; the CLI's send adds it itself)."""
    return MergeRequestDone(
        bead=bead,
        rig=rig,
        branch=branch,
        head=head,
        bundle=bundle,
        session=session,
        fence=fence,
        cmd_id=keyed_id(merge_request_id(session, head), secret),
    )


def finish(session: str, *, secret: str | None = None) -> SessionFinish:
    """Step 4: the session ends (its agent ran the saga to the end)."""
    return SessionFinish(session=session, cmd_id=keyed_id(finish_id(session), secret))
