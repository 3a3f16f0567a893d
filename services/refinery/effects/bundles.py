"""A session's published commits (``gt done``'s bundle) taken into the rig's clone before its merge request is
decided (``RefineryService.prepare``), or the reason they are refused."""

from __future__ import annotations

import asyncio
from pathlib import Path

import structlog

from services.refinery import decide
from services.refinery.effects import merger
from services.refinery.state import RefineryState
from shared.core.errors import CommandError
from shared.model import done_flow
from shared.model.commands import MergeRequestSubmit
from shared.model.rigs import home_name

log = structlog.get_logger(__name__)


async def take(
    state: RefineryState, cmd: MergeRequestSubmit, rigs_root: Path, max_bytes: int
) -> decide.BundleRefused | None:
    """Take a session's published commits into the rig's clone before its merge request is decided (while
    `gt done` waits, its workspace still there): refused at once when too large or not what it says. Only for
    a request its session may make: anything else is refused by ``decide`` without reading the file."""
    rig = state.rigs.get(cmd.rig)
    if rig is None:
        return None
    if cmd.bundle is None:
        return None
    try:
        if decide.from_session(cmd, "operator"):
            decide.check_session_submit(state, cmd, rig.base_branch)
        else:  # a crew member's `gt done`, by hand
            decide.check_hand_submit(state, cmd, cmd.target or rig.base_branch, rig.base_branch)
    except CommandError:
        return None
    publisher = done_flow.publisher(cmd.session, cmd.branch)
    if not publisher:
        return None
    published = f"/rigs/{home_name(rig)}/published/{publisher}/{cmd.head}.bundle"
    if not cmd.bundle.endswith(published):
        # Only where `gt done` publishes (the session's own folder, its head's name): never a file elsewhere
        # the refinery (root) could read and say things about.
        why = f"the bundle must be the session's own, ...{published}; got {cmd.bundle}"
        return decide.BundleRefused("invalid", why[:500])
    paths = merger.Paths(rigs_root, home_name(rig))
    problem = await asyncio.to_thread(merger.import_published, paths, rig, cmd, max_bytes)
    if problem is None:
        return None
    log.info("bundle_refused", mr_bead=cmd.bead, session=cmd.session, code=problem.code, why=problem.message)
    return decide.BundleRefused(problem.code, problem.message)
