"""What the CLI does over NATS: send a typed command as this process (an operator, or the polecat session it runs
in) and wait for its outcome, read an aggregate's history. Sending itself is ``shared.bus.commands``.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from gt.cli import hook_lease, identity, patience
from gt.story import HistoryEntry, history_entry
from shared.bus import commands as bus_commands
from shared.bus import streams
from shared.bus.commands import STORE_DEADLINE_S, Outcome
from shared.bus.query import max_payload
from shared.core import ids, subjects
from shared.core.config import TownConfig
from shared.model import session_identity
from shared.model.commands import DEFAULT_MAX_COMMAND_BYTES, Command, check_to_send
from shared.model.commands.base import Creates
from shared.model.queries.base import LATEST_SEQ

if TYPE_CHECKING:
    from shared.bus.connection import Connection

C = TypeVar("C", bound=Command)
R = TypeVar("R")

__all__ = ["Outcome", "first_event_of", "read_position", "send", "stream_last_seq", "with_ids"]


async def send(
    nc: Connection,
    config: TownConfig,
    cmd: Command[R],
    *,
    timeout: float | None,
    wait_if_down: bool = False,
) -> Outcome[R]:
    """Send ``cmd`` as this process and wait up to ``timeout`` (None: forever) for its outcome
    (``shared.bus.commands.send``; ``service_down`` unless ``wait_if_down`` when its service does not answer).

    It gets an id (``cli-<random>``) unless it has one, and a command that creates something the id of what it
    creates (``new_id``: known before the answer, so it can be printed while the service is down). From inside a
    polecat session it goes on the session's own subject, names the session's polecat as its actor unless it names
    one, and carries the bead's hook lease as its ``fence`` unless it has one (renewing the lease on the way).

    Raises:
        CommandError: the command is one the intake would refuse (a field over its limit, too large); nothing
            was sent.
        AppendFailedError: GT_CMD refused the command (too large, stream missing).
        PermissionDeniedError: this NATS user may not publish on the command's subject; nothing was stored.
    """
    cmd = with_ids(cmd)
    changes: dict[str, Any] = {}
    actor = identity.default_actor(cmd.actor)
    if actor is not None:
        changes["actor"] = actor  # sent from a polecat session: the command is its polecat's
    fence = hook_lease.session_fence()
    if fence is not None and cmd.fence is None:
        # Sent from inside a polecat session: carried out only while the session holds its bead's hook.
        changes["fence"] = fence
    if changes:
        cmd = msgspec.structs.replace(cmd, **changes)
    origin = identity.command_origin()
    limit = min(DEFAULT_MAX_COMMAND_BYTES, max_payload(nc))
    if isinstance(origin, subjects.SessionOrigin):
        limit = min(limit, session_identity.MAX_PAYLOAD)  # the agents' account carries no larger message
    check_to_send(cmd, bus_commands.encode(cmd), max_bytes=limit)
    if "fence" in changes and fence is not None:
        await hook_lease.renew(nc, config, fence)
    # Stored while NATS comes back for as long as the call waits for the town (an agent's: gt/cli/patience.py).
    wait = patience.current()
    outcome = await bus_commands.send(
        nc,
        config,
        cmd,
        origin=origin,
        timeout=timeout,
        wait_if_down=wait_if_down,
        store_deadline_s=max(STORE_DEADLINE_S, wait.patience_s),
        on_retry=wait.waiting if wait.patience_s > 0 else None,
    )
    wait.answered()
    return outcome


def with_ids(cmd: C) -> C:
    """``cmd`` with its own id (``cli-<random>``) and, when it creates something, the id of that (``new_id``),
    unless it has them: chosen by the sender, so both are known before any answer."""
    changes: dict[str, Any] = {}
    if not cmd.cmd_id:
        changes["cmd_id"] = f"cli-{secrets.token_hex(8)}"
    if isinstance(cmd, Creates) and cmd.new_id is None:
        changes["new_id"] = ids.random_bead_id(cmd.id_prefix())
    return msgspec.structs.replace(cmd, **changes) if changes else cmd


async def stream_last_seq(nc: Connection, config: TownConfig) -> int:
    return await streams.last_seq(nc, config.evt_stream)


async def read_position(nc: Connection, config: TownConfig) -> int:
    """The ``min_seq`` of a read that must see everything stored so far: the log's last sequence, or, inside a
    polecat session or the mayor agent (whose identity may not read the log's state), ``LATEST_SEQ``, which the
    service answering resolves when the query comes."""
    if identity.command_origin() is not None:
        return LATEST_SEQ
    return await stream_last_seq(nc, config)


async def first_event_of(
    nc: Connection,
    config: TownConfig,
    aggregate: str,
    aggregate_id: str,
    types: frozenset[str],
    timeout: float | None,
    *,
    where: Callable[[HistoryEntry], bool] | None = None,
) -> HistoryEntry | None:
    """The aggregate's first event of one of ``types`` (and, given ``where``, for which it holds), stored already
    or within ``timeout`` seconds (None: however long it takes), read from the log like outcomes; None when none
    came in time; None at once inside an agent (a session, the mayor agent), whose identity may not follow the log."""
    if identity.command_origin() is not None:
        return None
    found: asyncio.Future[HistoryEntry] = asyncio.get_running_loop().create_future()

    def on_message(seq: int, data: bytes) -> None:
        entry = history_entry(seq, data)
        if entry.type in types and (where is None or where(entry)) and not found.done():
            found.set_result(entry)

    async with streams.following(nc, config.evt_stream, subjects.event_subject(aggregate, aggregate_id), on_message):
        try:
            async with asyncio.timeout(timeout):
                return await found
        except TimeoutError:
            return None
