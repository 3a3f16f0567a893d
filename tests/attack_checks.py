"""What every pane attack's test judges of the town afterwards, whoever attacked (a polecat session's pane in
test_agent_attacks.py, the mayor agent's in tests/mayor_attack.py): the log and the commands are there, the log holds
nothing forged, no forged command was carried out, and the id the pane took was refused."""

from __future__ import annotations

from typing import Any

import nats.js.errors
from nats.aio.client import Client

from shared.core import subjects
from tests.attacks import nats_pane
from tests.log_tools import read_all


async def assert_log_unforged(nc: Client, forged_commands: tuple[str, ...]) -> None:
    js = nc.jetstream()
    assert (await js.stream_info("GT_EVT")).config.name == "GT_EVT", "the log is there"
    assert (await js.stream_info("GT_CMD")).config.name == "GT_CMD", "the commands are there"
    log = await read_all(nc, "GT_EVT")
    forged = [(seq, subject) for seq, subject, data in log if nats_pane.MARK.encode() in data]
    assert not forged, f"forged events in the log: {forged}"
    for cmd_id in forged_commands:
        try:
            outcome = await js.get_last_msg("GT_EVT", f"gt.evt.cmd.{cmd_id}", direct=True)
        except nats.js.errors.NotFoundError:
            continue
        raise AssertionError(f"command {cmd_id} was stored and carried out: {outcome.data!r}")


async def assert_taken_id_refused(nc: Client, report: dict[str, Any]) -> None:
    """A mail the pane sent naming the victim's bead's id as its new id: refused, nothing written over."""
    took = await nc.jetstream().get_last_msg("GT_EVT", subjects.outcome_subject(report["took_id"]), direct=True)
    assert b"cmd.rejected" in (took.data or b""), took.data
    assert b'"conflict"' in (took.data or b""), took.data
