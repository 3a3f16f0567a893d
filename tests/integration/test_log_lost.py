"""The town's log cannot vanish unnoticed (docs/failure-behaviour.md, "The log lost"): no service's credential may
delete or purge GT_EVT or GT_CMD, and a service that finds the log missing, or not the log its snapshot was taken
of, refuses to start as an empty town: it says so and exits, and `gt up` does not restart it but escalates.

On a real nats-server running the shipped accounts.conf; the log is deleted with the admin credential."""

from __future__ import annotations

import asyncio
import secrets
import sys
from collections.abc import Awaitable
from pathlib import Path

import nats
import nats.js.errors
import pytest

from gt.town.state import read_state
from gt.town_secrets import TownSecrets
from shared.bus.connection import close_quietly
from shared.bus.topology import provision
from shared.core.errors import EXIT_LOG_LOST
from tests.helpers import assert_eventually, wait_until
from tests.integration.test_town import TownCli
from tests.secured_town import SecuredTown, services_as_themselves
from tests.service_process import ManagedProcess

SERVICES = ("mayor", "witness", "refinery", "deacon")


async def test_no_services_credential_may_delete_purge_or_reconfigure_the_log(st: SecuredTown) -> None:
    mayor = await st.connect("mayor")
    try:
        await provision(mayor, st.config("mayor"))
    finally:
        await close_quietly(mayor)

    async def refused(attempt: Awaitable[object]) -> bool:
        """Whether the server refused it (an error, or no answer: a denied request is never answered)."""
        try:
            await asyncio.wait_for(attempt, 5)
        except (nats.js.errors.APIError, TimeoutError, nats.errors.TimeoutError):
            return True
        return False

    async def tries(service: str) -> dict[str, bool]:
        nc = await st.connect(service)
        js = nc.jetstream()
        try:
            info = await js.stream_info("GT_EVT")
            # All at once: each refused request waits out its timeout, and nothing depends on another's outcome.
            attempts = {
                "delete GT_EVT": js.delete_stream("GT_EVT"),
                "delete GT_CMD": js.delete_stream("GT_CMD"),
                "purge GT_EVT": js.purge_stream("GT_EVT"),
                "purge GT_CMD": js.purge_stream("GT_CMD"),
                "update GT_EVT": js.update_stream(info.config),
            }
            outcomes = await asyncio.gather(*(refused(attempt) for attempt in attempts.values()))
            return dict(zip(attempts, outcomes, strict=True))
        finally:
            await close_quietly(nc)

    for service, outcomes in zip(SERVICES, await asyncio.gather(*map(tries, SERVICES)), strict=True):
        assert all(outcomes.values()), f"{service} was let: {[what for what, no in outcomes.items() if not no]}"
    lines = st.violations()
    for service in SERVICES:
        assert any(f'"GT/user:{service}"' in line and "STREAM.DELETE.GT_EVT" in line for line in lines), lines
    admin = await st.connect("admin")
    try:
        assert (await admin.jetstream().stream_info("GT_EVT")).config.name == "GT_EVT", "still there"
        assert (await admin.jetstream().stream_info("GT_CMD")).config.name == "GT_CMD"
    finally:
        await close_quietly(admin)


def service_process(town: SecuredTown, name: str, root: Path, gt_env: dict[str, str]) -> ManagedProcess:
    """Service ``name`` as a real process, logged in as its own user."""
    env = {**gt_env, "NATS_URL": town.server.url, "GT_HOME": str(town.home), "NATS_USER": name}
    env["NATS_PASSWORD"] = town.passwords[name]
    return ManagedProcess([sys.executable, "-m", f"services.{name}", "--log-json"], env, root / f"{name}.log")


async def test_a_service_refuses_to_start_as_an_empty_town_over_a_lost_log(
    st: SecuredTown,
    tmp_path: Path,
    gt_env: dict[str, str],
) -> None:
    # A town with work in its log and a snapshot of it.
    async with services_as_themselves(st, tmp_path, "mayor"):
        created = await st.gt("operator", "bead", "create", "Work the town has done")
        assert created.returncode == 0, created.stderr
    admin = await st.connect("admin")
    js = admin.jetstream()
    try:
        before = (await js.stream_info("GT_CMD")).state.last_seq
        assert (await js.stream_info("GT_EVT")).state.last_seq > 0
        await js.delete_stream("GT_EVT")  # the admin's credential may (no service's may)

        # Each service, started as a real process with its own credential, refuses and says why; none recreates
        # the log over the town.
        for name in ("mayor", "deacon"):
            service = service_process(st, name, tmp_path, gt_env).start()
            try:
                await asyncio.to_thread(wait_until, lambda s=service: s.returncode() is not None, timeout=60)
                assert service.returncode() == EXIT_LOG_LOST, service.log_path.read_text()[-2000:]
                lost = [e for e in service.log_events() if e.get("event") == "event_log_lost"]
                assert lost, service.log_path.read_text()[-2000:]
                assert "GT_CMD" in lost[0]["why"], lost[0]
                assert lost[0]["stream"] == "GT_EVT", lost[0]
            finally:
                service.kill()
            with pytest.raises(nats.js.errors.NotFoundError):
                await js.stream_info("GT_EVT")
        assert (await js.stream_info("GT_CMD")).state.last_seq == before, "the waiting commands are kept"

        # The same when GT_CMD went too: the snapshots the services stored say the town had a log.
        await js.delete_stream("GT_CMD")
        assert (await js.stream_info("OBJ_GT_SNAP")).state.messages > 0
        service = service_process(st, "mayor", tmp_path, gt_env).start()
        try:
            await asyncio.to_thread(wait_until, lambda: service.returncode() is not None, timeout=60)
            assert service.returncode() == EXIT_LOG_LOST, service.log_path.read_text()[-2000:]
        finally:
            service.kill()
        with pytest.raises(nats.js.errors.NotFoundError):
            await js.stream_info("GT_EVT")
    finally:
        await close_quietly(admin)


async def test_gt_up_leaves_a_service_that_found_the_log_lost_down_and_escalates(
    gt_env: dict[str, str], tmp_path: Path
) -> None:
    """On a laptop: the log deleted (the admin's password is in GT_HOME/secrets) while the town runs. Every service
    stops on it; started again, each refuses (exit 3) and `gt up` leaves it down at once, with an escalation that
    says the log is lost, kept until the town can store it; `gt status` names the services left down."""
    town = TownCli({**gt_env, "GT_TMUX_SOCKET": f"gt-lost-{secrets.token_hex(4)}"}, tmp_path / "town")
    try:
        assert town("up", "-d", "--port", "0").returncode == 0
        assert town("bead", "create", "Work the town has done").returncode == 0
        state = read_state(town.config)
        assert state is not None
        password = TownSecrets(town.home).password("admin")
        admin = await nats.connect(state.nats_url, user="admin", password=password, inbox_prefix=b"_INBOX_admin")
        try:
            await admin.jetstream().delete_stream("GT_EVT")
        finally:
            await admin.close()

        def all_left_down() -> list[str]:
            now = read_state(town.config)
            assert now is not None
            assert sorted(now.gave_up) == ["deacon", "mayor", "refinery", "witness"], now.gave_up
            return now.gave_up

        await asyncio.to_thread(wait_until, all_left_down, timeout=90, message="every service left down")

        async def escalated() -> list[str]:
            # Kept in GT_HOME/run/escalations until stored, then waiting in GT_CMD for the mayor (durable: the
            # log restored, the mayor settles it).
            texts = [p.read_text() for p in (town.home / "run" / "escalations").glob("*.json")]
            admin = await nats.connect(state.nats_url, user="admin", password=password, inbox_prefix=b"_INBOX_admin")
            try:
                js = admin.jetstream()
                last = (await js.stream_info("GT_CMD")).state.last_seq
                for seq in range(1, last + 1):
                    try:
                        msg = await js.get_msg("GT_CMD", seq)
                    except nats.js.errors.NotFoundError:
                        continue
                    if msg.subject == "gt.cmd.escalation.raise":
                        texts.append((msg.data or b"").decode())
            finally:
                await admin.close()
            lost = [text for text in texts if "event log is lost" in text]
            assert len(lost) == 4, texts
            return lost

        lost: list[str] = await assert_eventually(escalated, timeout=60)
        assert lost
        status = town("status")
        assert status.returncode != 0
        assert "the event log is MISSING" in status.stdout, status.stdout
        mayor_log = (town.home / "logs" / "mayor.log").read_text()
        assert "event_log_lost" in mayor_log
    finally:
        town("down")
