"""Nudges: typing a queued nudge into its session's pane (retried until the text shows and the key took), and the
nudges the witness queues itself (a mail announcement, the prompt that sends a restarted agent on, the warning of
a filling context) or expires."""

from __future__ import annotations

import asyncio
import functools
import re
import time
from collections.abc import Callable
from datetime import timedelta

import structlog

from services.witness.effects.toolkit import Toolkit
from services.witness.plan.actions import ContinueSession, DeliverNudge, ExpireNudge, NudgeMail, WarnContext
from services.witness.state import agent_of, context_nudge_id, continue_nudge_id, mail_nudge_id
from shared.core.terminal import escape_line
from shared.host.tmux import typeable
from shared.model import runtimes
from shared.model.commands.mail import OPERATOR_ADDRESS, polecat_of
from shared.model.decision import NewEvent
from shared.model.events import NudgeDelivered, NudgeExpired, NudgeQueued

log = structlog.get_logger(__name__)

MAIL_SUBJECT_SHOWN = 120
RIGHT_QUOTE = "\u2019"
"""What a subject's own single quote is shown as in its announcement (``mail_announcement``)."""
"""Characters of a message's subject typed into the pane when announcing it."""
MAIL_NUDGE_TTL_S = 1800.0
"""How long a mail announcement waits for the polecat's session (its `gt prime` lists the mail anyway)."""
SESSION_NUDGE_TTL_S = 600.0
"""How long a nudge the witness queues for one session (sending it on after a restart, telling it its context is
filling up) waits to be delivered."""


class Nudger:
    def __init__(self, kit: Toolkit) -> None:
        self.kit = kit

    async def deliver_nudge(self, action: DeliverNudge) -> None:
        nudge = self.kit.host.state.nudges.get(action.nudge)
        session = self.kit.session(action.session)
        if nudge is None or nudge.status != "queued" or session is None or session.status != "started":
            return
        decided_on = nudge.version  # before the await: an expiry applied meanwhile makes the append conflict
        rig = self.kit.host.state.rigs.get(session.rig)
        typing = runtimes.runtime_for(agent_of(session, rig)).nudge(nudge.message)
        async with self.kit.pane_locks.hold(session.tmux_name):
            current = self.kit.host.state.nudges.get(action.nudge)
            if current is None or current.status != "queued":
                return  # delivered or expired while it waited for the pane
            attempts = await asyncio.to_thread(
                type_into, self.kit, session.tmux_name, session.id, typeable(typing.text), typing.submit
            )
        if attempts:
            event = NudgeDelivered(nudge_id=nudge.id, session=session.id, attempts=attempts)
            await self.kit.append(NewEvent(payload=event, expected_seq=decided_on))
            log.info("nudge_delivered", nudge=nudge.id, session=session.id, attempts=attempts)

    async def nudge_mail(self, action: NudgeMail) -> None:
        """Queue the nudge announcing a message; its id comes from the message's, so it is queued once whoever
        tries (a restart, a second witness); delivery is then the nudge's (``deliver_nudge``)."""
        notice = self.kit.host.state.mail.get(action.message)
        if notice is None or notice.nudged:
            return
        text = mail_announcement(notice.sender, notice.subject, notice.id)
        event = NudgeQueued(
            nudge_id=mail_nudge_id(notice.id),
            rig=notice.rig,
            polecat=notice.polecat,
            message=text,
            expires_at=self.kit.host.clock() + timedelta(seconds=MAIL_NUDGE_TTL_S),
        )
        if await self.kit.append(NewEvent(payload=event, expected_seq=0)):
            log.info("mail_nudge_queued", message=notice.id, rig=notice.rig, polecat=notice.polecat)

    async def continue_session(self, action: ContinueSession) -> None:
        """Queue the nudge that sends a restarted session on (``ContinueSession``)."""
        restart = runtimes.Restart(number=action.number, source=action.source, turn_ended_since=False)
        nudge_id = continue_nudge_id(action.session, action.number)
        if await self._queue_for(action.session, nudge_id, runtimes.continue_prompt(restart)):
            log.info("continue_nudge_queued", session=action.session, start=action.number, source=action.source)

    async def warn_context(self, action: WarnContext) -> None:
        """Queue the nudge that tells a session its context is filling up (``WarnContext``)."""
        nudge_id = context_nudge_id(action.session, action.share)
        if await self._queue_for(action.session, nudge_id, runtimes.CONTEXT_PROMPT.format(used=action.used)):
            log.info("context_nudge_queued", session=action.session, share=action.share, used=action.used)

    async def _queue_for(self, session_id: str, nudge_id: str, message: str) -> bool:
        """Queue a nudge for one running session; its id comes from what it is for, so it is queued once whoever
        tries; delivery is then the nudge's (``deliver_nudge``). Whether it was queued now."""
        session = self.kit.session(session_id)
        if session is None or session.status != "started" or nudge_id in self.kit.host.state.nudges:
            return False
        event = NudgeQueued(
            nudge_id=nudge_id,
            rig=session.rig,
            polecat=session.polecat,
            session=session.id,
            message=message,
            expires_at=self.kit.host.clock() + timedelta(seconds=SESSION_NUDGE_TTL_S),
        )
        return bool(await self.kit.append(NewEvent(payload=event, expected_seq=0)))

    async def expire_nudge(self, action: ExpireNudge) -> None:
        nudge = self.kit.host.state.nudges.get(action.nudge)
        if nudge is not None and nudge.status == "queued":
            expired = NudgeExpired(nudge_id=nudge.id, reason=action.reason)
            await self.kit.append(NewEvent(payload=expired, expected_seq=nudge.version))


def type_into(kit: Toolkit, name: str, label: str, message: str, submit: str = "Enter") -> int:
    """Type ``message`` into tmux session ``name`` (while it is still ``label``'s) and press ``submit``, retrying
    until the text shows and the key took; attempts, 0 if not."""
    tmux, verify_s = kit.tmux, kit.settings.nudge_verify_s
    probe = message[-60:]
    for attempt in range(1, 4):
        pane = tmux.snapshot().get(name)
        if pane is None or pane.label != label or pane.dead:
            return 0
        before = tmux.capture(name)
        if not shows(before, probe) or attempt == 1:
            tmux.send_text(name, message)
        if not _wait_for(lambda: shows(tmux.capture(name), probe), verify_s):
            continue
        typed = _screen(kit, name)
        tmux.send_key(name, submit)
        if _wait_for(functools.partial(_changed, kit, name, typed), verify_s):
            return attempt
    return 0


def _screen(kit: Toolkit, name: str) -> tuple[str, tuple[int, int]]:
    """What the pane shows and where its cursor is: a key that took changes one of them (a pane whose program does
    not read its input only moves the cursor; typing the text again there would show it twice)."""
    return kit.tmux.capture(name), kit.tmux.cursor(name)


def _changed(kit: Toolkit, name: str, before: tuple[str, tuple[int, int]]) -> bool:
    return _screen(kit, name) != before


def mail_announcement(sender: str, subject: str, message_id: str) -> str:
    """The line typed into a polecat's pane to announce a message: marked as mail, and whose, so the agent does not
    take it for its operator's words; the subject quoted, on one line, its control characters escaped and cut to
    ``MAIL_SUBJECT_SHOWN``. ``[gastown mail from polecat:demo/bob, written by an agent, not your operator]
    subject: 'Use v2' (read it with: gt mail read hq-4k2p9)``.

    An agent may be a shell that runs what is typed, and the subject is another agent's words: it stands in single
    quotes, inside which a shell expands nothing (no ``$(...)``, backquote, backslash or ``!``), with its own single
    quotes turned into right quotation marks (U+2019) so it cannot end them; and the parenthesis after it makes a
    shell refuse the whole line unrun. (In double quotes, with only ``"`` escaped, a subject ``\\"; cmd #`` ran
    ``cmd`` in the other session's pane: a red team's.)"""
    who = escape_line(sender)
    if OPERATOR_ADDRESS.fullmatch(sender):
        whose = f"{who}, your operator"
    elif polecat_of(sender) is not None:
        whose = f"{who}, written by an agent, not your operator"
    else:
        whose = f"{who}, not your operator"
    return typeable(
        f"[gastown mail from {whose}] subject: '{quoted(subject)}' (read it with: gt mail read "
        f"{escape_line(message_id)})"
    )


def quoted(text: str, limit: int = MAIL_SUBJECT_SHOWN) -> str:
    """Another's words as they are typed into a pane, between single quotes (in which a shell expands nothing):
    one line, control characters escaped, its own single quotes turned into right quotation marks (U+2019) so it
    cannot end them, cut to ``limit``."""
    shown = " ".join(escape_line(text.replace("\t", " ")).split()).replace("'", RIGHT_QUOTE)
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def escalation_announcement(escalation_id: str, severity: str, source: str, message: str) -> str:
    """The line typed into the mayor agent's pane to tell of an escalation: whose (not the operator's), its message
    quoted as a mail's subject is (``mail_announcement``), and how to see it."""
    return typeable(
        f"[gastown escalation {escape_line(escalation_id)} ({escape_line(severity)}) from {escape_line(source)}, "
        f"not your operator] '{quoted(message)}' (see it with: gt escalations)"
    )


def shows(screen: str, text: str) -> bool:
    """Whether ``text`` is on ``screen``, wrapped or not: a runtime's input box wraps a long line between its
    borders (``│``), which would otherwise hide it (and it was typed again)."""
    return _squeezed(text) in _squeezed(screen)


_NOT_TEXT = re.compile(r"[\s\u2500-\u259f]+")
"""Whitespace, box-drawing characters and block elements: a TUI's frame and wrapping, never a nudge's words."""


def _squeezed(text: str) -> str:
    return _NOT_TEXT.sub("", text)


def _wait_for(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
