"""What the CLI does over NATS: send a typed command as this process (an operator, or the polecat session it runs
in) and wait for its outcome, read an aggregate's history. Sending itself is ``shared.bus.commands``.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from typing import Any

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.js.api import ConsumerConfig, DeliverPolicy

from gt.cli import hook_lease, identity
from gt.story import HistoryEntry, history_entry
from shared import subjects
from shared.bus import commands as bus_commands
from shared.bus.commands import Outcome
from shared.commands import Command
from shared.config import TownConfig

__all__ = ["Outcome", "first_event_of", "send", "stream_last_seq"]


async def send(
    nc: Client,
    config: TownConfig,
    cmd: Command,
    *,
    timeout: float | None,
    wait_if_down: bool = False,
) -> Outcome:
    """Send ``cmd`` as this process and wait up to ``timeout`` (None: forever) for its outcome
    (``shared.bus.commands.send``; ``service_down`` unless ``wait_if_down`` when its service does not answer).

    It gets an id (``cli-<random>``) unless it has one. From inside a polecat session it goes on the session's own
    subject, names the session's polecat as its actor unless it names one, and carries the bead's hook lease as its
    ``fence`` unless it has one (renewing the lease on the way).

    Raises:
        AppendFailedError: GT_CMD refused the command (too large, stream missing).
        PermissionDeniedError: this NATS user may not publish on the command's subject; nothing was stored.
    """
    changes: dict[str, Any] = {}
    if not cmd.cmd_id:
        changes["cmd_id"] = f"cli-{secrets.token_hex(8)}"
    actor = identity.default_actor(cmd.actor)
    if actor is not None:
        changes["actor"] = actor  # sent from a polecat session: the command is its polecat's
    fence = hook_lease.session_fence()
    if fence is not None and cmd.fence is None:
        # Sent from inside a polecat session: carried out only while the session holds its bead's hook.
        changes["fence"] = fence
        await hook_lease.renew(nc, config, fence)
    if changes:
        cmd = msgspec.structs.replace(cmd, **changes)
    return await bus_commands.send(
        nc, config, cmd, origin=identity.session_origin(), timeout=timeout, wait_if_down=wait_if_down
    )


async def stream_last_seq(nc: Client, config: TownConfig) -> int:
    info = await nc.jetstream().stream_info(config.evt_stream)
    return int(info.state.last_seq)


async def first_event_of(
    nc: Client, config: TownConfig, aggregate: str, aggregate_id: str, types: frozenset[str], timeout: float
) -> HistoryEntry | None:
    """The aggregate's first event of one of ``types``, stored already or within ``timeout`` seconds (read from
    the log, like outcomes); None when none came in time."""
    found: asyncio.Future[HistoryEntry] = asyncio.get_running_loop().create_future()

    async def on_msg(msg: Any) -> None:
        entry = history_entry(subjects.parse_js_reply(msg.reply).stream_seq, msg.data)
        if entry.type in types and not found.done():
            found.set_result(entry)

    sub = await nc.jetstream().subscribe(
        subjects.event_subject(aggregate, aggregate_id),
        stream=config.evt_stream,
        cb=on_msg,
        ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
    )
    try:
        async with asyncio.timeout(timeout):
            return await found
    except TimeoutError:
        return None
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()
