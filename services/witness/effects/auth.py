"""The sessions' NATS logins (docs/architecture.md, "Identity"): the witness answers the server's auth callout on a
connection of its own as the ``auth`` user (a session may log in while the witness knows it and it has not
ended), and, when it has the ``sys`` user's password, cuts every connection it granted to a session that ended
since."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime

import msgspec

from services.witness.state import WitnessState
from shared.bus import auth_callout
from shared.bus.connection import Connection, close_quietly, connect
from shared.core.config import TownConfig
from shared.model import session_identity
from shared.model.session_identity import SessionBuckets

KICK_GRACE_S = 10.0
"""How long after a session ended its connections are cut: its own last `gt` call (`gt done` reading the outcome of
the command that ended it) finishes meanwhile; new logins are refused from the end on."""


def kick_due(state: WitnessState, session_id: str, now: datetime, grace_s: float = KICK_GRACE_S) -> bool:
    """Are the session's connections to be cut: it is unknown, or ended at least ``grace_s`` ago. A town agent's:
    once it is stopped."""
    if session_identity.town_agent_run_of(session_id) is not None:
        return not session_live(state, session_id)
    session = state.sessions.get(session_id)
    if session is None:
        return True
    if session.status != "ended":
        return False
    ended = session.ended_at
    if ended is None:
        return True
    if ended.tzinfo is None:
        ended = ended.replace(tzinfo=UTC)
    return (now - ended).total_seconds() >= grace_s


def session_live(state: WitnessState, login: str) -> bool:
    """May this session log in: the witness knows it and it has not ended (then its credential is dead). A town
    agent's launch (``agent-mayor#3``) may while it is started and that launch is its newest (at most one ahead of
    the one recorded: minted right before its ``town_agent.launched`` is)."""
    if (launch := session_identity.town_agent_run_of(login)) is not None:
        agent = state.town_agents.get(launch[0])
        return agent is not None and agent.wanted and launch[1] in (agent.run, agent.run + 1)
    session = state.sessions.get(login)
    return session is not None and session.status != "ended"


class SessionLogins:
    def __init__(
        self, config: TownConfig, settings: auth_callout.CalloutSettings, state: Callable[[], WitnessState]
    ) -> None:
        self.config = config
        self.settings = settings
        self._state = state
        self.responder: auth_callout.Responder | None = None
        self._kicker: Connection | None = None
        """The ``sys`` user's connection, when ``GT_NATS_SYS_PASSWORD`` is set: disconnects ended sessions."""
        self._kicking: dict[str, asyncio.Task[int]] = {}

    def live(self, session_id: str) -> bool:
        return session_live(self._state(), session_id)

    async def serve(self, identity: str) -> None:
        """The auth callout responder, on its own connection as the ``auth`` user. A bad request is answered and
        logged (``Responder``); anything else ends the witness's task group, as any of its loops would."""
        settings = self.settings
        config = msgspec.structs.replace(
            self.config,
            nats_user=auth_callout.AUTH_USER,
            nats_password=settings.auth_password,
            nats_creds=None,
            nats_inbox_prefix=None,
        )
        buckets = SessionBuckets(self.config.evt_stream, self.config.heartbeat_bucket, self.config.lease_bucket)
        self.responder = auth_callout.Responder(settings, buckets, self.live)
        nc = await connect(config, name=f"{identity}-auth-callout", connect_attempts=-1)
        try:
            if settings.sys_password:
                sys_config = msgspec.structs.replace(
                    config, nats_user=auth_callout.SYS_USER, nats_password=settings.sys_password
                )
                self._kicker = await connect(sys_config, name=f"{identity}-kicker", connect_attempts=-1)
            await self.responder.serve(nc)
        finally:
            await close_quietly(nc)
            if self._kicker is not None:
                await close_quietly(self._kicker)
                self._kicker = None

    async def kick_ended_sessions(self) -> None:
        """Level-triggered: every connection this witness granted to a session that has ended since is cut, once
        ``KICK_GRACE_S`` passed."""
        if self.responder is None or self._kicker is None:
            return
        state, now = self._state(), datetime.now(UTC)
        for session in [s for s in self.responder.connections if kick_due(state, s, now)]:
            if session in self._kicking:
                continue
            # In the background: a session may have logged in many times, and the reconcile must not wait.
            task = asyncio.create_task(self.responder.kick(self._kicker, session), name=f"kick-{session}")
            self._kicking[session] = task
            task.add_done_callback(lambda _, s=session: self._kicking.pop(s, None))  # type: ignore[misc]
