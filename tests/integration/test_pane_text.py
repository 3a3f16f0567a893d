"""Issue 20, point 8 (control characters): text typed into an agent's pane (nudges, mail announcements) never
carries a control character: ``\\x03`` would interrupt the agent, ``\\x1b[`` start an escape sequence. Real
nats-server, tmux; the agent is ``cat``, which ``\\x03`` kills."""

from __future__ import annotations

import json

from tests.drivers import send_and_wait
from tests.helpers import assert_eventually
from tests.integration.test_witness import started_session
from tests.witness_town import PolecatTown


async def cat_session(pt: PolecatTown) -> tuple[str, str, int, str]:
    """A session whose agent is ``cat`` (it echoes what is typed; ``\x03`` kills it): bead, id, pid, tmux name."""
    await pt.add_rig(agent_command="cat")
    bead = await pt.new_bead("Read what is typed")
    await pt.sling(bead)
    session_id, pane_pid, tmux_name = await started_session(pt, bead, 1)
    return bead, session_id, pane_pid, tmux_name


def not_interrupted(pt: PolecatTown, bead: str, session_id: str, pane_pid: int, tmux_name: str) -> None:
    pane = pt.tmux.snapshot()[tmux_name]
    assert not pane.dead, "the agent was not interrupted"
    assert pane.pane_pid == pane_pid
    session = pt.sessions_of(bead)[0]
    assert (session.id, session.status) == (session_id, "started")


async def test_a_nudge_with_control_characters_is_refused(pt: PolecatTown) -> None:
    bead, session_id, pane_pid, tmux_name = await cat_session(pt)
    for message in ("stop\x03now", "red \x1b[31m text", "bell\x07"):
        outcome = await pt.command("gt.cmd.nudge.send", target="demo/ace", message=message)
        assert (outcome["type"], outcome["code"]) == ("cmd.rejected", "invalid"), outcome
        assert "control characters" in outcome["message"]
    tabbed = await pt.ok("gt.cmd.nudge.send", target="demo/ace", message="a tab\tis fine")
    assert pt.witness is not None
    nudges = pt.witness.state.nudges
    await assert_eventually(lambda: getattr(nudges.get(tabbed["id"]), "status", None) == "delivered", timeout=30)
    await assert_eventually(lambda: "a tab is fine" in pt.tmux.capture(tmux_name), timeout=30)
    not_interrupted(pt, bead, session_id, pane_pid, tmux_name)


async def test_mail_is_announced_without_its_control_characters(pt: PolecatTown) -> None:
    bead, session_id, pane_pid, tmux_name = await cat_session(pt)
    # Mail is announced in the pane with its subject: its control characters escaped, never typed.
    body = {"to": "demo/ace", "subject": "urgent\x03 \x1b[2Jplease", "body": "read me", "cmd_id": "mail-ctl"}
    outcome = await send_and_wait(pt.nc, "gt.cmd.mail.send", json.dumps(body).encode(), "mail-ctl")
    assert outcome["type"] == "cmd.accepted", outcome
    sent = outcome["result"]

    def announced() -> str:
        screen = pt.tmux.capture(tmux_name).replace("\n", "")  # the line, as long as it is, wraps in the pane
        assert f"gt mail read {sent['id']}" in screen, screen
        return screen

    screen = await assert_eventually(announced, timeout=30)
    assert "urgent\\x03 \\x1b[2Jplease" in screen
    assert "\x03" not in screen
    assert "\x1b" not in screen
    not_interrupted(pt, bead, session_id, pane_pid, tmux_name)
