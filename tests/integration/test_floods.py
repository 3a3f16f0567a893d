"""Floods: one agent sending commands as fast as it can cannot fill the log, and the town keeps answering
everyone else. Real nats-server with the shipped accounts (the flood comes from a polecat session's own
identity, on its own subject)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec
import pytest
from nats.js.client import JetStreamContext

from shared.bus.connection import close_quietly, connect
from shared.core import subjects
from shared.core.subjects import SessionOrigin, session_command_subject
from shared.model.events import decode_envelope
from tests.helpers import assert_eventually
from tests.secured_town import SecuredTown, responder_for, services_as_themselves

FLOOD = 2_000
RATE, BURST = 5.0, 20.0
FLOODER = SessionOrigin("demo", "flooder", "hq-flood-1")
WRITER = SessionOrigin("demo", "writer", "hq-write-1")


async def outcomes_of(js: JetStreamContext, session: str, prefix: str) -> list[dict[str, object]]:
    """The payloads (with their type) of the outcomes stored for ``session``'s commands whose ids start with
    ``prefix``."""
    info = await js.stream_info("GT_EVT", subjects_filter=subjects.session_outcomes(session))
    out = []
    for subject in sorted(info.state.subjects or {}):
        if not subject.rpartition(".")[2].startswith(prefix):
            continue
        msg = await js.get_last_msg("GT_EVT", subject)
        env = decode_envelope(msg.data or b"")
        out.append({"type": env.type, **msgspec.json.decode(env.data)})
    return out


async def test_an_agent_flooding_mail_send_is_rate_limited_and_the_log_stays_bounded(
    st: SecuredTown,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GT_RATE_AGENT", f"{RATE:g}")
    monkeypatch.setenv("GT_RATE_AGENT_BURST", f"{BURST:g}")
    async with services_as_themselves(st, tmp_path, "mayor") as town:
        js = town.nc.jetstream()
        before = int((await js.stream_info("GT_EVT")).state.last_seq)
        async with responder_for(st, lambda s: s == FLOODER.session):
            agent = await connect(st.session_config(FLOODER, "hq-flood"), name="flooder")
        subject = session_command_subject("mail", "send", FLOODER)
        try:
            agent_js = agent.jetstream()
            started = time.monotonic()

            async def send(i: int) -> None:
                body = {"to": "mayor", "body": f"flood {i}", "cmd_id": f"flood-{i}"}
                await agent_js.publish(subject, msgspec.json.encode(body), stream="GT_CMD", timeout=30)

            flood = asyncio.gather(*(send(i) for i in range(FLOOD)))
            # Meanwhile the operator's commands are answered as usual.
            created = await st.gt("operator", "bead", "create", "Business as usual", "--wait")
            assert created.returncode == 0, created.stderr
            await flood

            async def all_settled() -> bool:
                info = await js.consumer_info("GT_CMD", "mayor-cmd")
                return bool(info.num_pending == 0 and info.num_ack_pending == 0)

            settled: bool = await assert_eventually(all_settled, timeout=120, interval=0.2)
            assert settled, "the mayor settled the flood"
            elapsed = time.monotonic() - started
        finally:
            await close_quietly(agent)

        outcomes = await outcomes_of(js, FLOODER.session, "flood-")
        accepted = [o for o in outcomes if o["type"] == "cmd.accepted"]
        limited = [o for o in outcomes if o["type"] == "cmd.rejected" and o["code"] == "rate_limited"]
        assert len(accepted) + len(limited) == len(outcomes), outcomes[:5]
        # The limiter's own bounds: accepted at most burst + rate * t, and as many refusals recorded.
        allowed = BURST + RATE * elapsed
        assert 0 < len(accepted) <= allowed, (len(accepted), allowed)
        assert 0 < len(limited) <= allowed, (len(limited), allowed)
        assert "send it again in" in str(limited[0]["message"])
        assert town.mayor is not None
        assert town.mayor.intake is not None
        assert town.mayor.intake.dropped >= FLOOD - 2 * allowed, "the rest were dropped without an outcome"
        stored = int((await js.stream_info("GT_EVT")).state.last_seq) - before
        # Each accepted mail.send stores a message and its outcome; the operator's bead two events more.
        assert stored <= 2 * len(accepted) + len(limited) + 2, stored


async def test_an_agent_writes_less_text_in_one_command_than_an_operator(
    st: SecuredTown,
    tmp_path: Path,
) -> None:
    long_text = "x" * 40_000  # well under the intake's 1 MiB, over an agent's 32 KiB
    async with services_as_themselves(st, tmp_path, "mayor") as town:
        js = town.nc.jetstream()
        before = int((await js.stream_info("GT_EVT")).state.last_seq)
        async with responder_for(st, lambda s: s == WRITER.session):
            by_agent = await st.gt_in_session(WRITER, "hq-write", "mail", "send", "mayor", "--body", long_text)
        assert by_agent.returncode == 1, (by_agent.returncode, by_agent.stdout, by_agent.stderr)
        assert "rejected (too_large)" in by_agent.stderr
        assert "GT_RATE_AGENT_MAX_COMMAND" in by_agent.stderr
        # Only the refusal was stored.
        assert int((await js.stream_info("GT_EVT")).state.last_seq) == before + 1
        by_operator = await st.gt("operator", "mail", "send", "mayor", "--body", long_text)
        assert by_operator.returncode == 0, by_operator.stderr
