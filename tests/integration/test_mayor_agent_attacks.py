"""The mayor agent as a hostile agent (issue 43: "its credentials cannot delete or purge streams, write other services'
subjects or keys, or act as an operator named otherwise"), in the laptop town (`gt up`: its embedded server with
the town's accounts and the witness's auth callout). The real Claude Code in the mayor agent's pane, driven by the
scripted model, runs with its Bash tool the NATS attacks a polecat session made work (tests/attacks/nats_pane.py,
with the mayor agent's own identity ``agent-mayor`` and subjects), then files a bead naming another operator as its
actor and tries to approve a gate. The town is unharmed, and the log records the mayor agent as itself. The compose
topology's run is test_agent_attacks.py's ``test_the_mayor_agents_attacks_fail_in_the_compose_topology``."""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path
from typing import Any

from gt.model_server import ModelServer
from tests.helpers import wait_until
from tests.integration.test_agent_attacks import (
    FORGED_COMMANDS,
    REPORT_DEADLINE_S,
    SCRIPT,
    gt_ok,
    laptop_town,
    operator_nats,
    read_if_there,
)
from tests.mayor_attack import ATTACK, CLAUDE, assert_acted_as_itself, assert_town_unharmed, mayor_attack_script
from tests.witness_town import make_origin


async def test_the_mayor_agents_attacks_from_its_pane_fail_and_it_acts_only_as_itself(
    gt_env: dict[str, str], tmp_path: Path
) -> None:
    CLAUDE.binary()
    socket = f"gt-mayor-attack-{secrets.token_hex(4)}"
    report = tmp_path / "attacker" / "report.json"
    report.parent.mkdir(parents=True)
    async with ModelServer([], default="mayor-attacks") as server:
        env = dict(gt_env)
        env.pop("GT_AGENT_ENV", None)
        env.update(CLAUDE.witness_env(server.base_url))
        with laptop_town(env, tmp_path / "town", socket) as town:
            await gt_ok(town, "up", "-d", "--port", "0")
            make_origin(tmp_path / "project")
            victim = (await gt_ok(town, "bead", "create", "The victim's work")).strip()
            server.add(mayor_attack_script(SCRIPT, report, victim))
            await gt_ok(town, "mayor", "start")
            asked = await asyncio.to_thread(town, "mayor", "ask", ATTACK, "--wait", "--timeout", "400", timeout=450)
            assert asked.returncode == 0, (asked.stdout, asked.stderr, server.failures)
            assert "Tried everything." in asked.stdout
            assert server.failures == [], server.failures
            got = await asyncio.to_thread(wait_until, lambda: read_if_there(report), timeout=REPORT_DEADLINE_S)
            attacked: dict[str, Any] = json.loads(got or "{}")
            victim_status = json.loads(town("bead", "show", victim, "--json").stdout)["status"]
            await gt_ok(town, "health", "mayor")
            await gt_ok(town, "health", "witness")
            async with operator_nats(town) as nc:
                await assert_town_unharmed(nc, attacked, victim_status, FORGED_COMMANDS)
            feed = await gt_ok(town, "feed", "--json", "--no-follow", "--since", "all")
            assert_acted_as_itself([json.loads(line) for line in feed.splitlines() if line.strip()])
            await gt_ok(town, "mayor", "stop")
        server.release()
