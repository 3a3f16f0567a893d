"""The town agents' sessions (docs/mayor-agent.md): launched in a pane of their own with a workspace, a runtime dir
and a NATS identity of their own (``agent-<name>`` in account AGENTS, its commands on its own subjects), ended when
stopped; their requests typed in, their answers read from their runtime's transcript.

A town agent's files, below ``GT_HOME/agents``: ``agent-<name>/work`` (its workspace, a git repository of its own
for its notes), ``agent-<name>/runtime`` (its runtime's config home and hook marks, ``GT_SESSION_DIR``) and, in
``secrets`` (the witness's, 0700), its NATS password and its pane's launch FIFO."""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
import time
from pathlib import Path

import structlog

from services.witness.effects import agent_user, runtime_setup, transcript_read
from services.witness.effects.agent_creds import agent_nats_credentials, is_credential
from services.witness.effects.agent_env import AGENT_ENV_PASSTHROUGH, AGENT_TERM
from services.witness.effects.nudge import escalation_announcement, mail_announcement, shows, type_into
from services.witness.effects.toolkit import Toolkit
from services.witness.plan.actions import DeliverAsk, EndTownAgent, LaunchTownAgent, RecordAnswer, TellTownAgent
from services.witness.state import TownAgent, TownAgentAsk
from shared.core import subjects
from shared.host import git, processes, reaper, safe_files
from shared.host.tmux import PaneInfo, TmuxError, typeable
from shared.model import session_identity, transcripts
from shared.model.commands import EscalationRaise
from shared.model.decision import NewEvent
from shared.model.events import TownAgentAnswered, TownAgentAskDelivered, TownAgentLaunched, TownAgentTold
from shared.model.runtimes import runtime_for

log = structlog.get_logger(__name__)

LAUNCH_TIMEOUT_S = 30.0
"""How long a launch waits for its pane's reaper to read the agent's command."""
LAUNCH_RETRY_S = 5.0
LAUNCH_RETRY_MAX_S = 300.0
"""A launch that failed (its binary missing, a credential that cannot be minted, tmux refusing) is tried again after
``LAUNCH_RETRY_S``, doubling up to this; the third failure in a row is escalated."""
ESCALATE_AFTER_FAILURES = 3
MAX_ANSWER = 16 * 1024
"""The most of an answer kept in ``town_agent.answered`` (an event: the log is no transcript store)."""


def agents_dir(gt_home: Path) -> Path:
    return gt_home / "agents"


def agent_dir(gt_home: Path, agent: TownAgent) -> Path:
    return agents_dir(gt_home) / agent.user


def runtime_dir(gt_home: Path, agent: TownAgent) -> Path:
    """Its runtime's config home and hook marks (a polecat session's ``session_dir``)."""
    return agent_dir(gt_home, agent) / "runtime"


def workspace(gt_home: Path, agent: TownAgent) -> Path:
    return agent_dir(gt_home, agent) / "work"


def password_file(gt_home: Path, agent: TownAgent) -> Path:
    """Its NATS password (``NATS_PASSWORD_FILE``), in the witness's ``secrets`` beside its pane's launch FIFO."""
    return agents_dir(gt_home) / "secrets" / f"{agent.user}.nats-password"


def beacon(agent: TownAgent) -> str:
    return (
        f"[gastown] You are the town's {agent.name} agent: the operator talks to the town through you. Run `gt prime` "
        "to see the town and the commands you may use, then wait: each request comes typed in. Act only through "
        "`gt`; say briefly what you did."
    )


def answer_seen(gt_home: Path, agent: TownAgent, ask: TownAgentAsk) -> tuple[str | None, bool]:
    """(the answer to ``ask``, delivered to the agent's current run, once the turn it began ended; whether its
    runtime took it in at all), from its transcript since it was typed. Reads files: call it in a thread."""
    runtime = runtime_for(agent.agent)
    lines = transcript_read.lines_since(runtime_dir(gt_home, agent), runtime, ask.transcript, ask.offset)
    answer = transcripts.answer_to(lines, ask.text, runtime.turn_mark)
    return answer, answer is not None or transcripts.heard(lines, ask.text, runtime.turn_mark)[0]


def turn_ended(gt_home: Path, agent: TownAgent) -> bool:
    """Its runtime ended a turn in this run (its newest transcript, written since it was launched): it is past its
    start, and what is typed now is taken in. Reads files: call it in a thread."""
    runtime = runtime_for(agent.agent)
    folder = runtime_dir(gt_home, agent)
    newest = transcript_read.newest(folder, runtime)
    if newest is None or agent.launched_at is None:
        return False
    try:
        if newest.lstat().st_mtime < agent.launched_at.timestamp():
            return False
    except OSError:
        return False
    return transcripts.heard(transcript_read.newest_lines(folder, runtime), "", runtime.turn_mark)[1]


class TownAgents:
    """Carries out the town agents' actions (``plan/town_agents.py``)."""

    def __init__(self, kit: Toolkit) -> None:
        self.kit = kit
        settings = kit.settings
        self._agent_credentials = (
            settings.agent_credentials if settings.agent_credentials is not None else agent_nats_credentials(os.environ)
        )
        self._failures: dict[str, tuple[int, float]] = {}
        """Town agent -> (its launches that failed in a row, when the last did: ``time.monotonic()``)."""

    def problem(self) -> str | None:
        """Why no town agent may be started here (``agent.start`` is refused saying so); None: it may."""
        if self.kit.agent_user is not None and self.kit.town_agent_user is None:
            return (
                f"the polecats run as GT_AGENT_USER={self.kit.agent_user.name}, and the mayor agent has no OS user of "
                "its own: set GT_TOWN_AGENT_USER on the witness to another unprivileged user (the image has `mayor`), "
                "or a polecat could read its credential"
            )
        return None

    def _agent(self, name: str) -> TownAgent | None:
        return self.kit.host.state.town_agents.get(name)

    @property
    def _home(self) -> Path:
        return self.kit.host.config.gt_home

    # ---- launch ------------------------------------------------------------------------------------

    async def launch(self, action: LaunchTownAgent) -> None:
        agent = self._agent(action.name)
        if agent is None or not agent.wanted or agent.run + 1 != action.run:
            return  # stopped, or launched meanwhile
        failed, at = self._failures.get(agent.name, (0, 0.0))
        if failed and time.monotonic() - at < min(LAUNCH_RETRY_MAX_S, LAUNCH_RETRY_S * 2 ** (failed - 1)):
            return  # backing off: the plan asks again at a later patrol
        try:
            pane = await asyncio.to_thread(self._pane, agent, action.run)
        except Exception as exc:  # noqa: BLE001 - any failure is retried with backoff, then escalated
            await self._failed(agent, failed + 1, exc)
            return
        self._failures.pop(agent.name, None)
        ref = processes.ref_of(pane.pane_pid)
        event = TownAgentLaunched(
            name=agent.name,
            run=action.run,
            tmux_name=agent.tmux_name,
            pane_pid=pane.pane_pid,
            pid_started=ref.started if ref is not None else 0.0,
        )
        if await self.kit.append(NewEvent(payload=event, expected_seq=agent.version)):
            log.info("town_agent_launched", agent=agent.name, run=action.run, runtime=agent.agent)

    async def _failed(self, agent: TownAgent, failures: int, exc: Exception) -> None:
        self._failures[agent.name] = (failures, time.monotonic())
        log.warning("town_agent_launch_failed", agent=agent.name, failures=failures, error=repr(exc)[:500])
        if failures == ESCALATE_AFTER_FAILURES:
            message = (
                f"the {agent.name} agent ({agent.agent}) could not be launched {failures} times in a row: "
                f"{str(exc)[:300]}; the witness keeps trying (`gt mayor stop` ends that)"
            )
            cmd_id = f"town-agent-launch-{agent.name}-{agent.run + 1}"
            await self.kit.host.store(
                EscalationRaise(severity="high", message=message, source="witness", cmd_id=cmd_id)
            )

    def _pane(self, agent: TownAgent, run: int) -> PaneInfo:
        """The agent's pane: one launched before a crash and never recorded is adopted; a dead one is ended and a
        new one launched."""
        tmux = self.kit.tmux
        existing = tmux.pane_of(agent.tmux_name)
        if existing is not None and existing.label == agent.user and tmux.ours(existing):
            if not existing.dead and existing.pane_pid != agent.pane_pid:
                return existing
            tmux.kill_if_labelled(agent.tmux_name, agent.user)
        elif existing is not None:
            raise TmuxError("new-session", f"tmux session {agent.tmux_name} is taken by something else; waiting")
        secrets = agents_dir(self._home) / "secrets"
        secrets.mkdir(mode=0o700, parents=True, exist_ok=True)
        fifo = secrets / f"{agent.user}.launch"
        fifo.unlink(missing_ok=True)
        reaper.make_launch(str(fifo))
        supervisor = reaper.argv(self.kit.settings.kill_grace_s, launch=str(fifo))
        try:
            pane = tmux.start(agent.tmux_name, None, cwd="/", env=None, label=agent.user, supervisor=supervisor)
        except BaseException:  # re-raised (cancellation too): only the FIFO nobody will read is removed
            fifo.unlink(missing_ok=True)
            raise
        try:
            command, env = self._command(agent, run, secrets)
            user = self.kit.town_agent_user
            run_as = user.argv_prefix() if user is not None else ()
            argv = [*run_as, "sh", "-c", f"cd -- {shlex.quote(str(workspace(self._home, agent)))} && {command}"]
            reaper.give_launch(str(fifo), argv, env, timeout=LAUNCH_TIMEOUT_S)
        except BaseException:  # re-raised: no pane is left waiting with no agent
            tmux.kill_if_labelled(agent.tmux_name, agent.user)
            fifo.unlink(missing_ok=True)
            raise
        return pane

    def _command(self, agent: TownAgent, run: int, secrets: Path) -> tuple[str, dict[str, str]]:
        """The agent's command line and environment, its runtime's files written first."""
        home, kit = self._home, self.kit
        work, runtime_home = workspace(home, agent), runtime_dir(home, agent)
        for folder in (agent_dir(home, agent), work, runtime_home):
            # Its folders are the agent's: one it swapped for a link (to a directory the witness would then write
            # into as root: a `git init`, its runtime's files) is never followed.
            if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
                raise safe_files.UnsafeFileError(f"{folder} is not a directory of the {agent.name} agent's own")
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not (work / ".git").is_dir():
            git.git("init", "-q", str(work), cwd=work)  # its runtime trusts a repository; its notes may go there
        env = self._env(agent, run, secrets)
        runtime = runtime_for(agent.agent)
        user = kit.town_agent_user
        owner = (user.uid, user.gid) if user is not None else None
        binary, added = runtime_setup.prepare(
            runtime,
            worktree=work,
            session_dir=runtime_home,
            env=os.environ,
            as_root=os.geteuid() == 0 and user is None,
            owner=owner,
        )
        env.update(added)
        if user is not None:
            # As a polecat's: its own directory and password file are its user's, and it may pass through the town's
            # directories above them (to nothing else of theirs).
            password = env.get("NATS_PASSWORD_FILE")
            user.hand_over(agent_dir(home, agent))
            if password:
                os.chown(password, user.uid, user.gid)
            agent_user.open_for_traversal([home, agents_dir(home), secrets])
            env.update(USER=user.name, LOGNAME=user.name)
        return runtime.command(beacon(agent), binary), env

    def _env(self, agent: TownAgent, run: int, secrets: Path) -> dict[str, str]:
        config = self.kit.host.config
        bin_dir = str(Path(sys.executable).parent)
        env = {
            subjects.TOWN_AGENT_ENV: agent.name,
            "GT_HOME": str(config.gt_home),
            "GT_EVT_STREAM": config.evt_stream,
            "GT_CMD_STREAM": config.cmd_stream,
            "NATS_URL": config.nats_url,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
            "TERM": AGENT_TERM,
            "GIT_AUTHOR_NAME": f"{agent.name} agent",
            "GIT_AUTHOR_EMAIL": f"{agent.name}.agent@gastown.invalid",
            "GIT_COMMITTER_NAME": f"{agent.name} agent",
            "GIT_COMMITTER_EMAIL": f"{agent.name}.agent@gastown.invalid",
        }
        env.update(self._credentials(agent, run))
        if (password := env.pop("NATS_PASSWORD", None)) is not None:
            path = password_file(self._home, agent)
            safe_files.write_private(path, password + "\n")
            env["NATS_PASSWORD_FILE"] = str(path)
        for key in (*AGENT_ENV_PASSTHROUGH, *self.kit.settings.agent_env):
            if key in os.environ and key not in env and not is_credential(key):
                env[key] = os.environ[key]
        return env

    def _credentials(self, agent: TownAgent, run: int) -> dict[str, str]:
        """Its own NATS identity when the witness answers the auth callout (``agent-<name>``, a password minted
        for this run of it, its own inbox); else the agents' shared credentials, as a session's."""
        callout = self.kit.host.callout
        if callout is None:
            return dict(self._agent_credentials)
        expires_at = int(self.kit.host.clock().timestamp() + callout.credential_ttl_s)
        password = session_identity.mint_town_agent(
            callout.session_key, name=agent.name, run=run, expires_at=expires_at
        )
        return {
            "NATS_USER": agent.user,
            "NATS_PASSWORD": password,
            "NATS_INBOX_PREFIX": subjects.session_inbox_prefix(agent.user),
        }

    # ---- end, requests, answers -------------------------------------------------------------------

    async def end(self, action: EndTownAgent) -> None:
        agent = self._agent(action.name)
        if agent is None or agent.wanted:
            return
        ended = await asyncio.to_thread(self.kit.tmux.kill_if_labelled, agent.tmux_name, agent.user)
        password_file(self._home, agent).unlink(missing_ok=True)  # dead anyway (its run), gone from the disk too
        if ended:
            log.info("town_agent_ended", agent=agent.name, run=agent.run)

    async def deliver(self, action: DeliverAsk) -> None:
        agent = self._agent(action.name)
        ask = next((a for a in agent.asks if a.id == action.ask), None) if agent is not None else None
        if agent is None or ask is None or agent.run != action.run or (ask.delivered_run == agent.run) != action.again:
            return
        runtime = runtime_for(agent.agent)
        folder = runtime_dir(self._home, agent)
        typing = runtime.nudge(ask.text)
        if action.again:
            # Typed before and not taken in: where the transcript ended then still holds; what sits in its input
            # box is sent (or, gone, typed again).
            transcript, offset = ask.transcript, ask.offset
            attempts = await asyncio.to_thread(self._send_again, agent, typeable(typing.text), typing.submit)
        else:
            # Where its transcript ends now: the answer is what follows (an earlier turn's is never taken for it).
            before = await asyncio.to_thread(transcript_read.newest, folder, runtime)
            transcript = str(before.relative_to(folder)) if before is not None else ""
            offset = await asyncio.to_thread(transcript_read.size_of, before) if before is not None else 0
            attempts = await asyncio.to_thread(
                type_into, self.kit, agent.tmux_name, agent.user, typeable(typing.text), typing.submit
            )
        if not attempts and not await asyncio.to_thread(self._taken_in, agent, ask, transcript, offset):
            log.warning("town_agent_ask_not_typed", agent=agent.name, ask=ask.id)
            return  # tried again at the next patrol where the agent is at its prompt
        event = TownAgentAskDelivered(
            name=agent.name, ask_id=ask.id, run=agent.run, transcript=transcript, offset=offset
        )
        if await self.kit.append(NewEvent(payload=event, expected_seq=agent.version)):
            log.info("town_agent_ask_delivered", agent=agent.name, ask=ask.id, run=agent.run, again=action.again)

    def _taken_in(self, agent: TownAgent, ask: TownAgentAsk, transcript: str, offset: int) -> bool:
        """Whether its runtime took the request in although the typing was not seen to take (a screen that did not
        show it in time): its transcript since then holds it. Typed again, it would be asked twice."""
        runtime = runtime_for(agent.agent)
        lines = transcript_read.lines_since(runtime_dir(self._home, agent), runtime, transcript, offset)
        return transcripts.heard(lines, ask.text, runtime.turn_mark)[0]

    def _send_again(self, agent: TownAgent, text: str, submit: str) -> int:
        tmux = self.kit.tmux
        pane = tmux.snapshot().get(agent.tmux_name)
        if pane is None or pane.label != agent.user or pane.dead:
            return 0
        if shows(tmux.capture(agent.tmux_name), text[-60:]):
            tmux.send_key(agent.tmux_name, submit)
            return 1
        return type_into(self.kit, agent.tmux_name, agent.user, text, submit)

    async def tell(self, action: TellTownAgent) -> None:
        agent = self._agent(action.name)
        notice = next((n for n in agent.notices if n.id == action.notice), None) if agent is not None else None
        if agent is None or notice is None or agent.run != action.run:
            return
        if notice.kind == "mail":
            text = mail_announcement(notice.sender, notice.subject, notice.id)
        else:
            text = escalation_announcement(notice.id, notice.severity, notice.sender, notice.subject)
        typing = runtime_for(agent.agent).nudge(text)
        attempts = await asyncio.to_thread(
            type_into, self.kit, agent.tmux_name, agent.user, typeable(typing.text), typing.submit
        )
        if not attempts:
            log.warning("town_agent_notice_not_typed", agent=agent.name, notice=notice.id)
            return
        if await self.kit.append(
            NewEvent(payload=TownAgentTold(name=agent.name, notice=notice.id), expected_seq=agent.version)
        ):
            log.info("town_agent_told", agent=agent.name, notice=notice.id, kind=notice.kind)

    async def record_answer(self, action: RecordAnswer) -> None:
        agent = self._agent(action.name)
        if agent is None or all(a.id != action.ask for a in agent.asks):
            return
        text = action.text if len(action.text) <= MAX_ANSWER else action.text[: MAX_ANSWER - 1] + "…"
        event = TownAgentAnswered(name=agent.name, ask_id=action.ask, text=text)
        if await self.kit.append(NewEvent(payload=event, expected_seq=agent.version)):
            log.info("town_agent_answered", agent=agent.name, ask=action.ask)
