"""What ``$GT_HOME/run/`` holds for a town: ``town.json`` (its supervisor, NATS, each child and whether it is
ready), the crash-loop escalations not yet sent, and the restart requests of ``gt up --service``."""

from __future__ import annotations

from pathlib import Path

import msgspec

from shared.core.config import TownConfig
from shared.host import processes
from shared.host.processes import ProcessRef


class TownState(msgspec.Struct, kw_only=True):
    """What ``run/town.json`` holds."""

    supervisor: ProcessRef
    nats_url: str
    nats: ProcessRef | None = None
    """The embedded nats-server, when the supervisor started one and it runs."""
    embedded: bool = False
    """The supervisor runs an embedded nats-server (and restarts it when it dies)."""
    services: dict[str, ProcessRef | None] = {}
    gave_up: list[str] = []
    """Services left down after a crash loop."""
    ready: bool = False
    replay: dict[str, tuple[int, int]] = {}
    """While starting: per service, the last sequence it has applied and the log's last sequence when the
    services started (what ``gt up -d`` draws its progress bar from)."""


def state_path(config: TownConfig) -> Path:
    return config.gt_home / "run" / "town.json"


def read_state(config: TownConfig) -> TownState | None:
    """The recorded town, or None when there is none or the file is unreadable."""
    try:
        return msgspec.json.decode(state_path(config).read_bytes(), type=TownState)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def running_town(config: TownConfig) -> TownState | None:
    """The recorded town if its supervisor still runs."""
    state = read_state(config)
    if state is not None and processes.is_alive(state.supervisor):
        return state
    return None


def write_state(config: TownConfig, state: TownState) -> None:
    path = state_path(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(msgspec.json.format(msgspec.json.encode(state), indent=2))
    tmp.replace(path)


def escalations_dir(config: TownConfig) -> Path:
    """Crash-loop escalations written and not yet stored in GT_CMD, one command per file."""
    return config.gt_home / "run" / "escalations"


def restart_requests_dir(config: TownConfig) -> Path:
    """``gt up --service NAME`` asks the running supervisor to restart NAME with a file ``NAME.request`` here."""
    return config.gt_home / "run" / "restart"
