"""The command fuzzer against the four real services on a real server: a bounded corpus of hostile bodies for
every command type (and for subjects nobody owns), published raw as any client could. Zero service crashes,
and every command ends in exactly one outcome."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from services.deacon.service import DeaconService
from shared.config import TownConfig
from tests.command_fuzz import SUBJECTS, UNKNOWN_SUBJECTS, body_for
from tests.helpers import assert_eventually
from tests.log_tools import outcomes
from tests.witness_town import FAST, PolecatTown, polecat_town

SEED = 20
BODIES_PER_SUBJECT = 6
"""Random bodies per command type, besides the fixed poison ones: a few hundred commands in all."""
POISON = (
    b'{"actor": "\xff\xfe"}',
    b'{"cmd_id": "x", "actor": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"actor": "\\ud800"}',
    b'{"actor": "x", "correlation_id": 1' + b"0" * 5_000 + b"}",
)


@pytest.fixture
async def town4(
    town: TownConfig, nc: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[PolecatTown]:
    monkeypatch.setenv("GT_CMD_MAX_DELIVER_CRASHES", "2")  # a command whose processing raises is set aside soon
    async with polecat_town(town, nc, tmp_path) as handle:
        handle.deacon = DeaconService(town, FAST)
        await handle.start("deacon", handle.deacon)
        yield handle


def corpus() -> list[tuple[str, str, bytes]]:
    """(command id, subject, body): the same corpus on every run."""
    rng = random.Random(SEED)
    out: list[tuple[str, str, bytes]] = []
    for subject in [*SUBJECTS, *UNKNOWN_SUBJECTS]:
        bodies = [*POISON, *(body_for(subject, rng) for _ in range(BODIES_PER_SUBJECT))]
        out.extend((f"fz-{len(out)}", subject, body) for body in bodies)
    return out


async def test_every_command_type_survives_the_fuzzer_with_one_outcome_each(nc: Client, town4: PolecatTown) -> None:
    commands = corpus()
    assert {subject for _, subject, _ in commands} >= set(SUBJECTS)
    for cmd_id, subject, body in commands:
        await nc.publish(subject, body, headers={"Nats-Msg-Id": cmd_id})
    await nc.flush()

    async def all_answered() -> dict[str, int]:
        for which, task in town4._tasks.items():
            if task.done():
                pytest.fail(f"the {which} stopped: {task.exception()!r}")
        stored = await outcomes(nc)
        missing = [(cmd_id, subject, body[:80]) for cmd_id, subject, body in commands if cmd_id not in stored]
        assert not missing, f"{len(missing)} without an outcome, e.g. {missing[:3]}"
        return {cmd_id: len(stored[cmd_id]) for cmd_id, _, _ in commands}

    counts: dict[str, int] = await assert_eventually(all_answered, timeout=240, interval=1.0)
    assert {cmd_id for cmd_id, n in counts.items() if n != 1} == set()
    for which, task in town4._tasks.items():
        assert not task.done(), f"the {which} stopped"
