"""How a gate runner runs: read from the environment."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path

import msgspec

from shared.core import subjects
from shared.core.config import env_number


class RunnerSettings(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    """``GT_RUNNER_NAME``: this runner among the town's (its service scope is ``runner-<name>``); the host's name
    by default."""
    home: str = ""
    """``GT_RUNNER_HOME``: where its clones, workspaces and gate logs are (``GT_HOME/runners/<name>`` by
    default)."""
    heartbeat_s: float = 5.0
    """``GT_RUNNER_HEARTBEAT``: seconds between a running job's heartbeats in the log."""
    stale_s: float = 30.0
    """``GT_RUNNER_STALE``: a running job whose runner wrote nothing for this long is taken by another runner."""
    gate_user: str = ""
    """``GT_GATE_USER``: the OS user the gates run as (the runner must run as root; ``shared.host.gates.user``)."""


def load(env: Mapping[str, str] | None = None, *, gt_home: Path) -> RunnerSettings:
    """Raises ValueError naming a setting whose value cannot be used."""
    env = os.environ if env is None else env
    default = re.sub(r"[^a-z0-9-]", "-", socket.gethostname().lower())[:40].strip("-") or "runner"
    name = env.get("GT_RUNNER_NAME", "").strip() or default
    if not subjects.RUNNER_NAME.match(name):
        raise ValueError(f"GT_RUNNER_NAME must be lower-case letters, digits and dashes (at most 40), got {name!r}")
    heartbeat = env_number(env, "GT_RUNNER_HEARTBEAT", 5.0, minimum=0.2)
    stale = env_number(env, "GT_RUNNER_STALE", 30.0, minimum=1.0)
    if stale <= 2 * heartbeat:
        raise ValueError(f"GT_RUNNER_STALE ({stale:g}) must be more than twice GT_RUNNER_HEARTBEAT ({heartbeat:g})")
    home = env.get("GT_RUNNER_HOME", "").strip() or str(gt_home / "runners" / name)
    return RunnerSettings(
        name=name, home=home, heartbeat_s=heartbeat, stale_s=stale, gate_user=env.get("GT_GATE_USER", "").strip()
    )
