"""The command fuzzer against the four real services on a real server: a bounded corpus of hostile bodies for
every command type (and for subjects nobody owns), published raw as any client could, on the plain subjects and
on sessions' and services' own subjects, valid and forged. Zero service crashes, and every command stored in
GT_CMD ends in exactly one outcome."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import nats.errors
import pytest
from nats.aio.client import Client

from services.deacon.service import DeaconService
from shared.core import ids
from shared.core.config import TownConfig
from shared.core.subjects import ServiceOrigin, SessionOrigin, split_origin
from tests.command_fuzz import EMPTY_TOKEN_SUBJECTS, SUBJECTS, UNKNOWN_SUBJECTS, body_for, subject_for
from tests.helpers import assert_eventually
from tests.log_tools import outcomes
from tests.witness_town import FAST, PolecatTown, polecat_town

SEED = 20
BODIES_PER_SUBJECT = 6
"""Random bodies per command type, besides the fixed poison ones: a few hundred commands in all."""
SUBJECTS_PER_COMMAND = 4
"""Subjects per command type in the subject corpus: a couple of hundred commands in all."""
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


POSING_SUBJECTS = ("gt.cmd.bead.create", "gt.cmd.mail.send")


def subject_corpus() -> list[tuple[str, str, bytes]]:
    """(command id, subject, body): every command type on subjects of every form, the same on every run."""
    rng = random.Random(SEED + 1)
    out: list[tuple[str, str, bytes]] = []
    for command in [*SUBJECTS, *UNKNOWN_SUBJECTS]:
        for _ in range(SUBJECTS_PER_COMMAND):
            body = rng.choice((body_for(command, rng), b'{"actor": "mayor"}', b'{"actor": "automation:x"}', b"{}"))
            out.append((f"fs-{len(out)}", subject_for(command, rng), body))
    out.extend(
        (f"fs-{len(out) + i}", subject, b'{"actor": "deacon"}') for i, subject in enumerate(EMPTY_TOKEN_SUBJECTS)
    )
    # Operators naming the mayor, whatever the draws above gave.
    out.extend((f"fs-{len(out) + i}", subject, b'{"actor": "mayor"}') for i, subject in enumerate(POSING_SUBJECTS))
    return out


async def test_every_command_type_survives_the_fuzzer_with_one_outcome_each(nc: Client, town4: PolecatTown) -> None:
    commands = corpus()
    assert {subject for _, subject, _ in commands} >= set(SUBJECTS)
    for cmd_id, subject, body in commands:
        await nc.publish(subject, body, headers={"Nats-Msg-Id": cmd_id})
    await nc.flush()
    await every_one_answered_once(nc, town4, commands)


async def test_every_subject_form_survives_the_fuzzer_with_one_outcome_each(nc: Client, town4: PolecatTown) -> None:
    """Sessions' and services' subjects, forged ones among them (another session's, a service nobody runs, too
    many or too few tokens, empty, non-ASCII and very long tokens): whatever GT_CMD stores is answered once."""
    commands = subject_corpus()
    js = nc.jetstream()
    stored: list[tuple[str, str, bytes]] = []
    not_stored: list[tuple[str, str]] = []
    for cmd_id, subject, body in commands:
        try:
            await js.publish(subject, body, stream="GT_CMD", headers={"Nats-Msg-Id": cmd_id}, timeout=10)
        except (nats.errors.Error, ValueError) as exc:
            # Not stored (no stream captures a subject with an empty token): nothing to answer.
            not_stored.append((subject, repr(exc)))
            continue
        stored.append((cmd_id, subject, body))
    assert {subject for subject, _ in not_stored} <= set(EMPTY_TOKEN_SUBJECTS), not_stored
    forms = {subject.count(".") for _, subject, _ in stored}
    assert {3, 4, 5, 6, 7} <= forms, forms
    answered = await every_one_answered_once(nc, town4, stored)
    # Who sent it is judged first: a service nobody runs, or an operator naming the mayor, is refused as such.
    nobody = {ServiceOrigin(name) for name in ("bob", "operator", "witness-")}
    forged = [cmd_id for cmd_id, subject, _ in stored if split_origin(subject)[1] in nobody]
    posing = [cmd_id for cmd_id, subject, body in stored if subject.count(".") == 3 and body == b'{"actor": "mayor"}']
    assert forged, "the corpus holds services nobody runs"
    assert posing, "and operators naming the mayor"
    assert {answered[cmd_id] for cmd_id in [*forged, *posing]} == {"unauthorized"}


async def every_one_answered_once(
    nc: Client, town4: PolecatTown, commands: list[tuple[str, str, bytes]]
) -> dict[str, str]:
    """Wait until each command has its outcome, no service stopped meanwhile, none has two; the outcomes' types
    (``accepted``) or reason codes, by command id."""

    # A session's command is settled in its own namespace (``ids.session_scoped_id``).
    settled_as = {cmd_id: settled_id(cmd_id, subject) for cmd_id, subject, _ in commands}

    async def all_answered() -> dict[str, int]:
        for which, task in town4._tasks.items():
            if task.done():
                pytest.fail(f"the {which} stopped: {task.exception()!r}")
        stored = await outcomes(nc)
        missing = [(c, subject, body[:80]) for c, subject, body in commands if settled_as[c] not in stored]
        assert not missing, f"{len(missing)} without an outcome, e.g. {missing[:3]}"
        return {cmd_id: len(stored[settled_as[cmd_id]]) for cmd_id, _, _ in commands}

    counts: dict[str, int] = await assert_eventually(all_answered, timeout=240, interval=1.0)
    assert {cmd_id for cmd_id, n in counts.items() if n != 1} == set()
    for which, task in town4._tasks.items():
        assert not task.done(), f"the {which} stopped"
    stored = await outcomes(nc)
    return {
        cmd_id: str(msgspec.json.decode(stored[settled_as[cmd_id]][0].data).get("code", "accepted"))
        for cmd_id, _, _ in commands
    }


def settled_id(cmd_id: str, subject: str) -> str:
    """The id the intake settles a command under: a session's in the session's namespace."""
    _command, origin = split_origin(subject)
    return ids.session_scoped_id(origin.session, cmd_id) if isinstance(origin, SessionOrigin) else cmd_id
