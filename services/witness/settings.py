"""How the witness watches and recovers sessions: read from the environment, with defaults from Gas Town."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

import msgspec

from services.witness.effects.agent_creds import agent_nats_credentials
from services.witness.plan.scope import parse_rigs
from shared.core.config import env_number

DEFAULT_TMUX_SOCKET = "gastown"
DEFAULT_CONTEXT_HANDOFF = (0.6, 0.8)
"""Gas City warns its agents at 60% and 80% of their context."""
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class WitnessSettings(msgspec.Struct, frozen=True, kw_only=True):
    tmux_socket: str = DEFAULT_TMUX_SOCKET
    """The tmux server (``tmux -L <socket>``) polecat sessions run on (``GT_TMUX_SOCKET``)."""
    usage_interval_s: float = 30.0
    """A running session's token usage is recorded at most this often (``GT_USAGE_INTERVAL``)."""
    context_handoff_at: tuple[float, ...] = DEFAULT_CONTEXT_HANDOFF
    gate_quiet_s: float = 30.0
    """A session whose bead waits on a closed gate is ended once quiet this long (``GT_GATE_QUIET``)."""
    """Shares of its model's context window at which a session is told to hand off (``GT_CONTEXT_HANDOFF``,
    comma-separated, ``off``: never): once per share it passes, read from its usage."""
    min_orphan_age_s: float = 60.0
    """A tmux session no session of ours accounts for is killed only once this old (``GT_MIN_ORPHAN_AGE``)."""
    done_stuck_after_s: float = 60.0
    """An agent still alive this long after its done-intent is stuck in done (``GT_DONE_STUCK_AFTER``)."""
    kill_grace_s: float = 3.0
    """Between SIGTERM and SIGKILL when a live agent is killed (``GT_KILL_GRACE``)."""
    done_exit_grace_s: float = 60.0
    """How long an agent may run on after `gt done` ended its session, to see what `gt done` said, before the
    witness ends it (``GT_DONE_EXIT_GRACE``); an agent that exits sooner is cleaned up at once."""
    mass_death_count: int = 3
    """Sessions of this many different beads of one rig dying within ``mass_death_window_s`` are a mass death."""
    mass_death_window_s: float = 30.0
    respawn_backoff_s: float = 5.0
    """A bead whose session died quickly is respawned this long after the death, twice as long after each further
    quick death in a row (``GT_RESPAWN_BACKOFF``; 0: at once)."""
    respawn_backoff_max_s: float = 300.0
    """The longest a respawn waits (``GT_RESPAWN_BACKOFF_MAX``)."""
    respawn_backoff_reset_s: float = 300.0
    """A session that lived this long, or got a step done, was no quick death: the backoff starts over
    (``GT_RESPAWN_BACKOFF_RESET``)."""
    max_start_failures: int = 3
    start_confirm_s: float = 120.0
    """How long an agent runtime that confirms its start (Claude Code's SessionStart hook) may take to do so
    before its session is a failed start (``GT_AGENT_START_TIMEOUT``)."""
    workers: int = 8
    """Actions carried out at once (git and tmux run in threads)."""
    nudge_verify_s: float = 3.0
    """How long a nudge's text may take to show in the pane before it is typed again."""
    hook_lease_ttl_s: float = 0.0
    """TTL of a session's hook lease, renewed by every ``gt`` call of its agent and by the witness while the agent
    shows activity (``plan/liveness.py``) (``GT_HOOK_LEASE_TTL``); 0: the
    rig's ``stall_after_s``. An agent that lets it lapse is fenced out and its bead goes to a fresh session."""
    agent_env: tuple[str, ...] = ()
    """Names of more of the witness's environment variables an agent gets (``GT_AGENT_ENV``, comma-separated),
    e.g. ``ANTHROPIC_API_KEY``; agents start with a clean environment otherwise."""
    rigs: frozenset[str] | None = None
    """The rigs this witness serves (``GT_WITNESS_RIGS``, comma-separated); None: all of them. Witnesses of
    disjoint sets of rigs run side by side; see ``plan/scope.py``."""
    agent_user: str = ""
    """``GT_AGENT_USER``: the OS user agents run as (the witness must run as root, see ``effects/agent_user.py``).
    Empty: the witness's own user, which can read everything the town keeps (docs/deployment.md)."""
    town_agent_user: str = ""
    """``GT_TOWN_AGENT_USER``: the OS user the town agents (the mayor agent) run as. Required when ``agent_user`` is
    set, and another: the polecats' user could otherwise read the mayor agent's credential and files. Empty (and no
    ``agent_user``): the witness's own user, as the polecats."""
    agent_credentials: dict[str, str] | None = None
    """The NATS credentials sessions get when no auth callout is configured (``agent_creds``: ``GT_AGENT_NATS_*``,
    else the witness's own ``NATS_*``), read by ``load`` before the witness's secrets leave its environment
    (``shared.core.config.forget_secrets``). None: read from the environment when the executor is made."""


def load(env: Mapping[str, str] | None = None) -> WitnessSettings:
    """Raises ValueError naming a setting whose value cannot be used."""
    env = os.environ if env is None else env
    socket = env.get("GT_TMUX_SOCKET") or DEFAULT_TMUX_SOCKET
    if not socket.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"GT_TMUX_SOCKET must be letters, digits, - and _, got {socket!r}")
    agent_env = tuple(name.strip() for name in env.get("GT_AGENT_ENV", "").split(",") if name.strip())
    bad = [name for name in agent_env if not _ENV_NAME.fullmatch(name)]
    if bad:
        raise ValueError(f"GT_AGENT_ENV must list environment variable names, got {', '.join(map(repr, bad))}")
    return WitnessSettings(
        tmux_socket=socket,
        min_orphan_age_s=env_number(env, "GT_MIN_ORPHAN_AGE", 60.0, minimum=0.0),
        done_stuck_after_s=env_number(env, "GT_DONE_STUCK_AFTER", 60.0, minimum=0.0),
        kill_grace_s=env_number(env, "GT_KILL_GRACE", 3.0, minimum=0.0),
        done_exit_grace_s=env_number(env, "GT_DONE_EXIT_GRACE", 60.0, minimum=0.0),
        hook_lease_ttl_s=env_number(env, "GT_HOOK_LEASE_TTL", 0.0, minimum=0.0),
        start_confirm_s=env_number(env, "GT_AGENT_START_TIMEOUT", 120.0, minimum=1.0),
        respawn_backoff_s=env_number(env, "GT_RESPAWN_BACKOFF", 5.0, minimum=0.0),
        respawn_backoff_max_s=env_number(env, "GT_RESPAWN_BACKOFF_MAX", 300.0, minimum=0.0),
        respawn_backoff_reset_s=env_number(env, "GT_RESPAWN_BACKOFF_RESET", 300.0, minimum=0.0),
        agent_env=agent_env,
        rigs=parse_rigs(env.get("GT_WITNESS_RIGS")),
        usage_interval_s=env_number(env, "GT_USAGE_INTERVAL", 30.0, minimum=0.0),
        context_handoff_at=context_shares(env.get("GT_CONTEXT_HANDOFF")),
        gate_quiet_s=env_number(env, "GT_GATE_QUIET", 30.0, minimum=0.0),
        agent_user=env.get("GT_AGENT_USER", "").strip(),
        town_agent_user=env.get("GT_TOWN_AGENT_USER", "").strip(),
        agent_credentials=agent_nats_credentials(env),
    )


def context_shares(text: str | None) -> tuple[float, ...]:
    """``GT_CONTEXT_HANDOFF``: shares of the context window, ascending (unset: ``DEFAULT_CONTEXT_HANDOFF``; ``off``:
    none). Raises ValueError for anything but numbers above 0 and below 1."""
    if text is None or not text.strip():
        return DEFAULT_CONTEXT_HANDOFF
    if text.strip().lower() == "off":
        return ()
    shares = []
    for part in text.split(","):
        try:
            share = float(part)
        except ValueError:
            share = -1.0
        if not 0.0 < share < 1.0:
            raise ValueError(
                f"GT_CONTEXT_HANDOFF must be shares of the context window between 0 and 1, comma-separated "
                f"(like 0.6,0.8), or off; got {text!r}"
            )
        shares.append(share)
    return tuple(sorted(set(shares)))
