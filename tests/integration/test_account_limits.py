"""The town's JetStream account limits as shipped (ops/nats/accounts.conf, with the values of
ops/gastown.env.example and docker-compose.yml) on a real nats-server: in force, read by the deacon's disk alarm,
and a full account refuses appends with a clear error while everything stored stays readable and the command
that did not fit waits to be carried out once there is room."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import nats.errors
import pytest
import structlog

from gt.cli.common import EXIT_REJECTED
from tests.compose_stack import shipped_account_limits
from tests.conftest import REPO_ROOT
from tests.helpers import assert_eventually
from tests.log_tools import events_of
from tests.secured_town import SecuredTown, services_as_themselves

GIB, MIB = 2**30, 2**20


def size(value: str) -> int:
    """A size as nats-server reads it from the shipped example (``30GB``, ``256MB``: powers of 1024)."""
    units = {"GB": GIB, "MB": MIB, "KB": 1024}
    return int(value[:-2]) * units[value[-2:]]


async def test_the_shipped_account_limits_are_in_force(st: SecuredTown, tmp_path: Path) -> None:
    shipped = shipped_account_limits(REPO_ROOT)
    async with services_as_themselves(st, tmp_path, "mayor") as town:
        info = await town.nc.jetstream().account_info()  # $JS.API.INFO, as the operator
    assert info.limits.max_storage == size(shipped["GT_NATS_MAX_FILE"]) == 30 * GIB
    assert info.limits.max_memory == size(shipped["GT_NATS_MAX_MEM"]) == 256 * MIB
    assert info.limits.max_streams == 64
    assert info.limits.max_consumers == 4096
    # The town fits in them with room to spare.
    assert info.streams <= 16
    assert info.consumers <= 64
    assert info.memory == 0


async def test_the_disk_alarm_reads_the_shipped_account_limit(
    st: SecuredTown,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Only the account is watched (no volume), and at 100% any use of it is "low": the escalation names it.
    monkeypatch.setenv("GT_DISK_WATCH", "")
    monkeypatch.setenv("GT_DISK_LOW_PERCENT", "100")
    monkeypatch.setenv("GT_DISK_CHECK_INTERVAL", "0.1")
    async with services_as_themselves(st, tmp_path, "mayor", "deacon") as town:

        async def raised() -> list[dict[str, Any]]:
            found = await events_of(town.nc, "gt.evt.escalation.>")
            return [d for kind, d in found if kind == "escalation.raised" and d["source"] == "deacon/disk"]

        escalations: list[dict[str, Any]] = await assert_eventually(
            raised, timeout=30, message="the deacon reads the account's limit through NATS, as the deacon user"
        )
    message = escalations[0]["message"]
    assert message.startswith("the NATS account's JetStream storage has 100.0% free (30.00 GiB)"), message
    assert st.violations() == []


SMALL_ACCOUNT = {"GT_NATS_MAX_FILE": "1MB", "GT_NATS_MAX_MEM": "1MB"}


@pytest.fixture
def account_limits(request: pytest.FixtureRequest) -> dict[str, str]:
    """The shipped limits, or a test's own (``indirect`` parametrization)."""
    limits: dict[str, str] = getattr(request, "param", None) or shipped_account_limits(REPO_ROOT)
    return limits


DESCRIPTION = "x" * 100_000
"""About a tenth of the small account per bead."""


@pytest.mark.parametrize("account_limits", [SMALL_ACCOUNT], indirect=True, ids=["1MB"])
async def test_a_full_account_refuses_appends_keeps_what_it_stored_and_carries_on_once_raised(
    st: SecuredTown,
    tmp_path: Path,
) -> None:
    async with services_as_themselves(st, tmp_path, "mayor") as town:
        js = town.nc.jetstream()
        assert (await js.account_info()).limits.max_storage == MIB
        created: list[str] = []
        waiting: str | None = None
        refused = None
        with structlog.testing.capture_logs() as logs:
            for i in range(20):
                done = await st.gt("operator", "bead", "create", f"bead {i}", "-d", DESCRIPTION, "--timeout", "3")
                if done.returncode == 0 and "gt: stored: command " in done.stderr:
                    # In GT_CMD, but its events do not fit the log: it waits there (stdout: the bead's id to be).
                    waiting = done.stderr.split("gt: stored: command ")[1].split()[0]
                elif done.returncode == 0 and done.stdout.startswith("hq-"):
                    created.append(done.stdout.split(":")[0].strip())
                else:
                    refused = done
                    break
        assert 5 <= len(created) <= 10, created
        assert waiting is not None, "the command that no longer fitted the log waits in GT_CMD"
        # The next command does not even fit GT_CMD: refused at once, saying why and what to do.
        assert refused is not None
        assert refused.returncode == EXIT_REJECTED, refused
        assert "resource limits exceeded for account" in refused.stderr
        assert "GT_NATS_MAX_FILE" in refused.stderr
        assert "Nothing already stored is lost" in refused.stderr
        # The mayor says why it cannot settle the waiting command, and keeps it (no rejection, no set-aside).
        full = [e for e in logs if e["event"] == "log_storage_full"]
        assert full, [e["event"] for e in logs if e["log_level"] == "error"]
        assert full[0]["subject"] == f"gt.evt.cmd.{waiting}"
        assert "GT_NATS_MAX_FILE" in full[0]["hint"]
        assert not [e for e in logs if e["event"] in ("command_set_aside", "command_failed")]
        assert (await js.account_info()).storage <= MIB

        # Everything stored stays readable: every bead through the mayor, and the log itself.
        for bead in created:
            shown = await st.gt("operator", "bead", "show", bead, "--json")
            assert shown.returncode == 0, shown.stderr
            assert json.loads(shown.stdout)["description"] == DESCRIPTION
        history = await events_of(town.nc, "gt.evt.bead.>")
        assert sum(1 for kind, _ in history if kind == "bead.created") == len(created)
        outcomes = await events_of(town.nc, f"gt.evt.cmd.{waiting}")
        assert outcomes == [], "the waiting command has no outcome yet"

        # The operator raises the limit (a restart of the server): the waiting command is carried out.
        assert st.server.env is not None
        st.server.env["GT_NATS_MAX_FILE"] = "4MB"
        st.server.restart()

        async def settled() -> list[tuple[str, dict[str, Any]]]:
            try:
                return await events_of(town.nc, f"gt.evt.cmd.{waiting}")
            except (TimeoutError, nats.errors.Error):
                return []  # still reconnecting to the restarted server

        after: list[tuple[str, dict[str, Any]]] = await assert_eventually(
            settled, timeout=60, message="the waiting command is carried out once the account has room"
        )
        assert after[0][0] == "cmd.accepted", after
        history = await events_of(town.nc, "gt.evt.bead.>")
        assert sum(1 for kind, _ in history if kind == "bead.created") == len(created) + 1
