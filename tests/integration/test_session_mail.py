"""Mail is private between polecats at the query level too (issue 20): on a real nats-server with the shipped
accounts, two live polecat sessions in real tmux, each logged in as itself, the real `gt` inside one session reads
no other polecat's mail through any query (a message of others is refused ``unauthorized``; lists leave it out),
while its own mail, and everything for the operator, reads as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from services.witness.state import Session
from shared.core.subjects import SessionOrigin
from tests.helpers import assert_eventually
from tests.integration.test_command_origin import use_the_witness_identity
from tests.secured_town import SecuredTown, services_as_themselves
from tests.witness_town import PolecatTown


async def two_live_sessions(town: PolecatTown) -> tuple[Session, Session]:
    await town.add_rig(agent_command="sleep 600", max_polecats=2)
    beads = [await town.new_bead("First"), await town.new_bead("Second")]
    for bead in beads:
        await town.sling(bead)

    def started() -> tuple[Session, Session]:
        found = [town.sessions_of(bead) for bead in beads]
        for sessions in found:
            assert sessions, found
            assert sessions[-1].status == "started", found
        return found[0][-1], found[1][-1]

    result: tuple[Session, Session] = await assert_eventually(started, timeout=60, interval=0.1)
    return result


async def test_a_sessions_gt_reads_no_other_polecats_mail(
    st: SecuredTown, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_the_witness_identity(st, monkeypatch)
    async with services_as_themselves(st, tmp_path, "mayor", "witness") as town:
        a, b = await two_live_sessions(town)
        origin_a = SessionOrigin(a.rig, a.polecat, a.id)
        to_b = await st.gt("operator", "mail", "send", f"polecat:demo/{b.polecat}", "--body", "secret for b")
        assert to_b.returncode == 0, to_b.stderr
        secret = to_b.stdout.split(":")[0]
        to_a = await st.gt("operator", "mail", "send", f"polecat:demo/{a.polecat}", "--body", "hello a")
        assert to_a.returncode == 0, to_a.stderr
        mine = to_a.stdout.split(":")[0]

        async def in_a(*args: str) -> Any:
            return await st.gt_in_session(origin_a, a.bead, *args)

        for args in (("mail", "read", secret), ("bead", "show", secret), ("bead", "deps", secret)):
            done = await in_a(*args)
            assert done.returncode == 1, (args, done)
            assert "gt: unauthorized:" in done.stderr, (args, done.stderr)
            assert "secret for b" not in done.stdout
        listed = await in_a("bead", "list", "--type", "message", "--json")
        assert listed.returncode == 0, listed.stderr
        assert [m["id"] for m in json.loads(listed.stdout)] == [mine], "its own mail only"
        everything = await in_a("bead", "list", "--all", "--json")
        assert secret not in everything.stdout
        assert "secret for b" not in everything.stdout
        read = await in_a("mail", "read", mine)
        assert read.returncode == 0, read.stderr
        assert "hello a" in read.stdout

        # The operator (and session b) still read b's mail.
        shown = await st.gt("operator", "bead", "show", secret, "--json")
        assert json.loads(shown.stdout)["description"] == "secret for b"
        listed_b = await st.gt_in_session(SessionOrigin(b.rig, b.polecat, b.id), b.bead, "bead", "list", "--json")
        assert secret in listed_b.stdout
