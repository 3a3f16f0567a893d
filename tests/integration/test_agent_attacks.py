"""Every NATS attack a polecat session made work in the red team's run (../shared/research/redteam-turn4.md: the
reply-subject injections T8-T9, the laptop's superuser attacks L3-L10, the limits P20-P21), run from a real
polecat pane: the rig's agent command is tests/attacks/nats_pane.py, started by the witness in tmux with exactly the
session's environment and credentials. Both ways a town runs: `gt up` on a laptop (its embedded server with the
town's accounts) and the compose topology (in containers under podman when it is ready, else as local processes).

After the attacks the town is unharmed: GT_EVT and GT_CMD are there and hold nothing forged, no forged command has an
outcome, the victim's bead is open, the heartbeats bucket was not purged, the mayor still holds its activity key and
is healthy; the pane saw nothing but its own inbox, its oversized message was refused and its subscriptions capped.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats
import nats.js.errors
from nats.aio.client import Client

from gt.town_secrets import operator_login
from tests.attacks import nats_pane
from tests.compose_stack import USERS, ComposeStack, running_stack
from tests.conftest import REPO_ROOT
from tests.helpers import wait_until
from tests.integration.test_town import TownCli
from tests.log_tools import read_all
from tests.witness_town import make_origin

SCRIPT = Path(nats_pane.__file__)
FORGED_COMMANDS = ("forged-close", "forged-unsling", "forged-close-plain", "huge-1", "flood-0", "flood-199")
REPORT_DEADLINE_S = 180.0


def agent_command(script: str, report: str, victim: str) -> str:
    """The rig's agent: the attacks, then it stays (a pane that ended would be respawned, attacking again)."""
    return f"python {shlex.quote(script)} {shlex.quote(report)} {shlex.quote(victim)}; sleep 3600"


async def assert_unharmed(nc: Client, victim_status: Callable[[], str], report: dict[str, Any]) -> None:
    js = nc.jetstream()
    assert (await js.stream_info("GT_EVT")).config.name == "GT_EVT", "the log is there"
    assert (await js.stream_info("GT_CMD")).config.name == "GT_CMD", "the commands are there"
    log = await read_all(nc, "GT_EVT")
    forged = [(seq, subject) for seq, subject, data in log if nats_pane.MARK.encode() in data]
    assert not forged, f"forged events in the log: {forged}"
    for cmd_id in FORGED_COMMANDS:
        try:
            outcome = await js.get_last_msg("GT_EVT", f"gt.evt.cmd.{cmd_id}", direct=True)
        except nats.js.errors.NotFoundError:
            continue
        raise AssertionError(f"command {cmd_id} was stored and carried out: {outcome.data!r}")
    assert victim_status() == "open", "the victim's bead is as it was"
    # The heartbeats bucket was not purged: the pane's own key (written by the attack) is still there.
    own = await js.get_last_msg("KV_GT_HEARTBEATS", f"$KV.GT_HEARTBEATS.{report['session']}", direct=True)
    assert own.data, "the session's own heartbeat key survived"
    mayor = await js.get_last_msg("KV_GT_ACTIVE", "$KV.GT_ACTIVE.mayor", direct=True)
    assert b"attacker" not in (mayor.data or b""), mayor.data
    # What the pane itself saw: only its own inbox; the huge message cut its connection; subscriptions capped.
    assert report["eavesdropped"] == [], report["eavesdropped"]
    huge = report["limits"]["huge_message"]
    assert huge["closed"] or any("ayload" in e for e in huge["errors"]), huge
    subs = report["limits"]["subscriptions"]
    assert not subs["connected"] or any("subscriptions" in e.lower() for e in subs["errors"]), subs
    tried = {a["attack"] for a in report["attempts"]}
    assert set(nats_pane.targets("x")) <= tried, tried


def wait_for_report(read: Callable[[], str | None]) -> dict[str, Any]:
    text = wait_until(read, timeout=REPORT_DEADLINE_S, interval=0.5, message="the pane's attack report")
    assert text is not None
    report: dict[str, Any] = json.loads(text)
    return report


async def test_a_sessions_nats_attacks_from_its_pane_fail_in_the_laptop_town(
    gt_env: dict[str, str], tmp_path: Path
) -> None:
    town = TownCli({**gt_env, "GT_TMUX_SOCKET": f"gt-attack-{secrets.token_hex(4)}"}, tmp_path / "town")
    try:
        up = town("up", "-d", "--port", "0")
        assert up.returncode == 0, up.stderr + up.stdout
        origin = make_origin(tmp_path / "project")
        victim = town("bead", "create", "The victim's work")
        assert victim.returncode == 0, victim.stderr
        victim_id = victim.stdout.strip()
        report_path = tmp_path / "report.json"
        added = town(
            "rig", "add", "demo", str(origin), "--agent", agent_command(str(SCRIPT), str(report_path), victim_id)
        )
        assert added.returncode == 0, added.stderr
        bead = town("bead", "create", "The attacker's bead")
        slung = town("sling", bead.stdout.strip(), "demo")
        assert slung.returncode == 0, slung.stderr
        report = await asyncio.to_thread(
            wait_for_report, lambda: report_path.read_text() if report_path.exists() else None
        )

        def victim_status() -> str:
            shown = town("bead", "show", victim_id, "--json")
            assert shown.returncode == 0, shown.stderr
            status: str = json.loads(shown.stdout)["status"]
            return status

        state = town("health", "mayor")
        assert state.returncode == 0, state.stdout + state.stderr
        login = operator_login(town.home)
        assert login is not None
        url = json.loads((town.home / "run" / "town.json").read_text())["nats_url"]
        nc = await nats.connect(url, user=login[0], password=login[1], inbox_prefix=b"_INBOX_operator")
        try:
            await assert_unharmed(nc, lambda: victim_status(), report)
        finally:
            await nc.close()
        assert town("health", "mayor").returncode == 0, "the mayor is active and healthy"
    finally:
        town("down", "--sessions")


async def test_a_sessions_nats_attacks_from_its_pane_fail_in_the_compose_topology(
    gt_env: dict[str, str], tmp_path: Path
) -> None:
    passwords = {user: secrets.token_hex(12) for user in USERS}
    with running_stack(REPO_ROOT, tmp_path / "stack", gt_env, passwords) as stack:
        env = {
            **gt_env,
            "NATS_URL": ",".join(stack.urls()),
            "NATS_USER": "operator",
            "NATS_PASSWORD": stack.passwords["operator"],
            "GT_HOME": str(tmp_path / "operator-home"),
        }

        def gt(*args: str) -> str:
            run = subprocess.run(
                [sys.executable, "-m", "gt.cli.main", *args], env=env, capture_output=True, text=True, timeout=120
            )
            assert run.returncode == 0, f"gt {' '.join(args)}: {run.stdout}{run.stderr}"
            return run.stdout.strip()

        if isinstance(stack, ComposeStack):
            # The agent runs in the witness's container: the script goes onto the gt-home volume.
            where = "/var/lib/gastown/attack"
            stack.exec(
                "witness", "sh", "-c", f"mkdir -p {where} && cat > {where}/nats_pane.py", stdin=SCRIPT.read_text()
            )
            script, report_at = f"{where}/nats_pane.py", f"{where}/report.json"

            def read_report() -> str | None:
                run = subprocess.run(
                    ["podman", "exec", stack.container("witness"), "cat", report_at],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                return run.stdout if run.returncode == 0 and run.stdout else None
        else:
            script, report_at = str(SCRIPT), str(tmp_path / "report.json")

            def read_report() -> str | None:
                path = Path(report_at)
                return path.read_text() if path.exists() else None

        origin = stack.make_origin()
        victim = gt("bead", "create", "The victim's work")
        gt("rig", "add", "demo", origin, "--agent", agent_command(script, report_at, victim))
        gt("sling", gt("bead", "create", "The attacker's bead"), "demo")
        try:
            report = await asyncio.to_thread(wait_for_report, read_report)
        except AssertionError:
            print(stack.log_tail("witness", 60))
            print(gt("session", "list", "--all"))
            raise
        nc = await nats.connect(
            servers=stack.urls(), user="operator", password=passwords["operator"], inbox_prefix=b"_INBOX_operator"
        )
        try:
            await assert_unharmed(nc, lambda: str(json.loads(gt("bead", "show", victim, "--json"))["status"]), report)
        finally:
            await nc.close()
        gt("health", "mayor")
