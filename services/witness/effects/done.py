"""The witness's side of the `gt done` saga (``shared/model/done_flow.py``): an agent that died or hung after its
done-intent has its branch published and its merge request submitted for it, as `gt done` would, then its session
ended ``done``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import structlog

from services.witness.effects.toolkit import Toolkit
from services.witness.state import Session
from shared.core.faults import crash_point
from shared.core.ids import hook_lease_name
from shared.host import git
from shared.model import done_flow
from shared.model.commands import Fence

log = structlog.get_logger(__name__)


class DoneFinisher:
    def __init__(self, kit: Toolkit) -> None:
        self.kit = kit

    async def finish(self, session: Session, after: str) -> None:
        """The agent died (or hung) after its done-intent: publish the branch and submit it, as `gt done` would."""
        kit = self.kit
        rig = kit.host.state.rigs.get(session.rig)
        if rig is None:
            return
        try:
            async with kit.worktree_locks.hold(session.worktree):
                published = await asyncio.to_thread(
                    git.publish, Path(session.worktree), session.branch, rig.base_branch, kit.published_dir(session)
                )
        except git.GitError as exc:
            log.warning("done_flow_failed", session=session.id, error=str(exc))
            death = "stalled" if after == "stuck_in_done" else after
            await kit.end(session, death, f"the done flow could not finish: {exc}"[:2000])
            return
        crash_point("witness.after_done_push")
        fence = None
        if session.lease_token is not None:
            # On the session's behalf, with its hook lease: the refinery takes the bead's work from its holder only.
            fence = Fence(lease=hook_lease_name(session.bead), token=session.lease_token)
        done = done_flow.merge_request(
            session=session.id,
            bead=session.bead,
            rig=session.rig,
            branch=session.branch,
            head=published.head,
            bundle=str(published.bundle),
            fence=fence,
        )
        await kit.host.store(done)
        crash_point("witness.after_mr_submit")
        await kit.end(session, "done", f"done flow finished by the witness after {after}")
        log.info("done_flow_finished_by_witness", session=session.id, head=published.head)
