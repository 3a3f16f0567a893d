"""What a session's agent is started with: its command line (from the rig's runtime, its files written first), its
environment (the session's ``GT_*``, its NATS identity, its git identity, what it gets of the witness's own) and
the beacon it reads first."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from services.witness.effects import runtime_setup
from services.witness.effects.agent_creds import agent_nats_credentials, is_credential
from services.witness.effects.toolkit import Toolkit
from services.witness.state import Rig, Session, agent_of
from shared.core import subjects
from shared.core.ids import hook_lease_name
from shared.host import safe_files
from shared.model import runtimes, session_identity
from shared.model.commands.rigs import git_identity
from shared.model.formulas import rework
from shared.model.rigs import home_name

AGENT_ENV_PASSTHROUGH = (
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LC_ALL",
    "TZ",
    "TMPDIR",
    "GT_LOG_LEVEL",
    "GT_TOWN_PATIENCE",
)
"""What an agent gets of the witness's environment besides its own settings (plus ``GT_AGENT_ENV``); NATS
credentials are chosen by ``agent_nats_credentials``."""
AGENT_TERM = "screen-256color"
"""The pane is a tmux terminal, whatever terminal the witness was started from."""


class AgentLaunch:
    def __init__(self, kit: Toolkit) -> None:
        self.kit = kit
        settings = kit.settings
        self._agent_credentials = (
            settings.agent_credentials if settings.agent_credentials is not None else agent_nats_credentials(os.environ)
        )
        """What sessions get without an auth callout: read once, before the witness forgot its secrets."""

    def command(self, session: Session, rig: Rig) -> tuple[str, dict[str, str]]:
        """The pane's command line and environment, from the rig's runtime (its files written first)."""
        kit = self.kit
        runtime = runtimes.runtime_for(agent_of(session, rig))
        env = self.env(session, rig)
        binary = ""
        if runtime.binary_name:
            binary, added = runtime_setup.prepare(
                runtime,
                worktree=Path(session.worktree),
                session_dir=kit.session_dir(session),
                env=os.environ,
                as_root=os.geteuid() == 0 and kit.agent_user is None,
                owner=(kit.agent_user.uid, kit.agent_user.gid) if kit.agent_user is not None else None,
            )
            env.update(added)  # its own HOME and config home win over the witness's
        elif kit.agent_user is not None:
            # The witness's HOME is root's: the agent gets one of its own in the session's runtime dir.
            env["HOME"] = str(kit.session_dir(session) / "home")
        if kit.agent_user is not None:
            env.update(USER=kit.agent_user.name, LOGNAME=kit.agent_user.name)
        command = runtime.command(self.beacon(session), binary)
        return command, env

    def beacon(self, session: Session) -> str:
        state = self.kit.host.state
        bead = state.beads.get(session.bead)
        title = bead.title if bead else ""
        progress = ""
        if bead is not None and bead.steps:
            progress = (
                f" Molecule: {len(bead.done_steps)}/{len(bead.steps)} steps done, current step "
                f"{bead.current_step or '(none: all done)'}."
            )
            if bead.current_step is not None and rework.is_rework(bead.current_step):
                progress += " The merge queue sent your work back: the rework steps say what to do."
        return (
            f"[gastown] You are polecat {session.polecat} of rig {session.rig} (session {session.id}, attempt "
            f"{session.attempt}). Your hook: bead {session.bead}: {title}.{progress} Worktree {session.worktree}, "
            f"branch {session.branch}. Run `gt prime` for everything you need; finish with `gt done`."
        )

    def env(self, session: Session, rig: Rig) -> dict[str, str]:
        kit = self.kit
        config = kit.host.config
        bin_dir = str(Path(sys.executable).parent)
        env = {
            "GT_RIG": rig.name,
            "GT_RIG_HOME": home_name(rig),
            "GT_BEAD": session.bead,
            "GT_SESSION": session.id,
            "GT_POLECAT": session.polecat,
            "GT_WORKTREE": session.worktree,
            "GT_BRANCH": session.branch,
            "GT_BASE_BRANCH": rig.base_branch,
            "GT_ATTEMPT": str(session.attempt),
            "GT_BEACON": self.beacon(session),
            "GT_HOME": str(config.gt_home),
            "GT_EVT_STREAM": config.evt_stream,
            "GT_CMD_STREAM": config.cmd_stream,
            "GT_HEARTBEAT_BUCKET": config.heartbeat_bucket,
            "GT_LEASE_BUCKET": config.lease_bucket,
            "GT_TMUX_SOCKET": kit.settings.tmux_socket,
            "NATS_URL": config.nats_url,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
            "TERM": AGENT_TERM,
            **polecat_git_env(rig, session.polecat),
        }
        if session.lease_token is not None:
            env["GT_LEASE"] = hook_lease_name(session.bead)
            env["GT_LEASE_TOKEN"] = str(session.lease_token)
            # Its TTL: an agent busy in a long command knows how often to renew it (gt-agent's heartbeats).
            hook = kit.host.state.hooks.get(env["GT_LEASE"])
            env["GT_LEASE_TTL"] = f"{hook.ttl_s if hook is not None else rig.stall_after_s:g}"
        env.update(self._session_credentials(session))
        if (password := env.pop("NATS_PASSWORD", None)) is not None:
            env["NATS_PASSWORD_FILE"] = str(self._write_password(session, password))
        for key in (*AGENT_ENV_PASSTHROUGH, *kit.settings.agent_env):
            if key in os.environ and key not in env and not is_credential(key):
                env[key] = os.environ[key]
        for key, value in os.environ.items():
            if key.startswith("GT_AGENT_") and not is_credential(key):
                env.setdefault(key, value)  # the reference agent's settings and fault injection
        return env

    def _session_credentials(self, session: Session) -> dict[str, str]:
        """The session's own NATS identity when the witness answers the auth callout: user = its session id,
        a password minted for it (good for ``GT_SESSION_CREDENTIAL_TTL``; a session that outlives it must hand
        off), its private inbox prefix. Else the agents' shared credentials (``agent_creds``)."""
        callout = self.kit.host.callout
        if callout is None:
            return dict(self._agent_credentials)
        expires_at = int(self.kit.host.clock().timestamp() + callout.credential_ttl_s)
        password = session_identity.mint(
            callout.session_key,
            session=session.id,
            rig=session.rig,
            polecat=session.polecat,
            bead=session.bead,
            expires_at=expires_at,
        )
        return {
            "NATS_USER": session.id,
            "NATS_PASSWORD": password,
            "NATS_INBOX_PREFIX": subjects.session_inbox_prefix(session.id),
        }

    def _write_password(self, session: Session, password: str) -> Path:
        path = self.kit.password_file(session)
        safe_files.write_private(path, password + "\n")
        return path


def polecat_git_env(rig: Rig, polecat: str) -> dict[str, str]:
    """Who the polecat's commits are by, whatever its HOME's git configuration holds (often none: a container,
    a service user, a per-agent config home): the rig's identity, or ``<rig>/<polecat>`` by default."""
    name, email = git_identity(rig.git_name, rig.git_email, rig=rig.name, polecat=polecat)
    return {
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_COMMITTER_NAME": name,
        "GIT_COMMITTER_EMAIL": email,
    }
