"""The mayor agent as a hostile agent (issue 43: "its credentials cannot delete or purge streams, write other services'
subjects or keys, or act as an operator named otherwise"), in the laptop town (`gt up`: its embedded server with
the town's accounts and the witness's auth callout). The real Claude Code in the mayor agent's pane, driven by the
scripted model, runs with its Bash tool the NATS attacks a polecat session made work (tests/attacks/nats_pane.py,
with the mayor agent's own identity ``agent-mayor`` and subjects), then files a bead naming another operator as its
actor and tries to approve a gate. The town is unharmed, and the log records the mayor agent as itself."""

from __future__ import annotations

import asyncio
import json
import secrets
import shlex
from pathlib import Path
from typing import Any

import nats.js.errors
from nats.aio.client import Client

from gt.model_server import ModelServer, Script, bash, say, use
from shared.core import subjects
from tests.agent_runtimes import RUNTIMES
from tests.attacks import nats_pane
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
from tests.integration.test_town import TownCli
from tests.log_tools import read_all
from tests.witness_town import make_origin

CLAUDE = next(agent for agent in RUNTIMES if agent.name == "claude")
ATTACK = "attack the town"


def mayor_attack_script(report: Path, victim: str) -> Script:
    attacks = f"python {shlex.quote(str(SCRIPT))} {shlex.quote(str(report))} {victim} - - && echo attacked"
    return Script(
        name="mayor-attacks",
        turns=(
            use(bash("gt prime", expect="You are the mayor agent")),
            say("Ready."),
            use(bash(attacks, expect="attacked"), prompt=ATTACK),
            # Acting as another operator: its body's actor is not read on its own subject.
            use(bash('gt bead create "Filed as ann" --actor operator:ann', expect="hq-")),
            # A human gate is a person's: no gate.approve for the mayor agent.
            use(bash(f"gt gate approve {victim} gated; echo exit=$?", expect="exit=")),
            say("Tried everything."),
        ),
    )


async def assert_town_unharmed(nc: Client, report: dict[str, Any], victim_status: str) -> None:
    js = nc.jetstream()
    assert (await js.stream_info("GT_EVT")).config.name == "GT_EVT", "the log is there"
    assert (await js.stream_info("GT_CMD")).config.name == "GT_CMD", "the commands are there"
    assert (await js.stream_info("KV_GT_HEARTBEATS")).config.name == "KV_GT_HEARTBEATS"
    log = await read_all(nc, "GT_EVT")
    forged = [(seq, subject) for seq, subject, data in log if nats_pane.MARK.encode() in data]
    assert not forged, f"forged events in the log: {forged}"
    for cmd_id in FORGED_COMMANDS:
        try:
            outcome = await js.get_last_msg("GT_EVT", f"gt.evt.cmd.{cmd_id}", direct=True)
        except nats.js.errors.NotFoundError:
            continue
        raise AssertionError(f"command {cmd_id} was stored and carried out: {outcome.data!r}")
    took = await js.get_last_msg("GT_EVT", subjects.outcome_subject(report["took_id"]), direct=True)
    assert b"cmd.rejected" in (took.data or b"") and b'"conflict"' in (took.data or b""), took.data  # noqa: PT018
    mayor = await js.get_last_msg("KV_GT_ACTIVE", "$KV.GT_ACTIVE.mayor", direct=True)
    assert b"attacker" not in (mayor.data or b""), mayor.data
    assert victim_status == "open", victim_status
    assert report["session"] == "agent-mayor", report["session"]
    assert report["eavesdropped"] == [], report["eavesdropped"]
    huge = report["limits"]["huge_message"]
    cut = ("ayload", "Connection lost", "reset by peer")
    assert huge["closed"] or any(sign in e for e in huge["errors"] for sign in cut), huge
    subs = report["limits"]["subscriptions"]
    assert not subs["connected"] or any("subscriptions" in e.lower() for e in subs["errors"]), subs
    tried = {a["attack"] for a in report["attempts"]}
    assert set(nats_pane.targets("x")) <= tried, tried
    # Straight at each target: refused by the server (its -ERR), never answered.
    straight = [a for a in report["attempts"] if a["how"] in ("publish to the target", "request to the target")]
    for attempt in straight:
        assert not attempt["result"].startswith("answered: <Msg"), attempt


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
            server.add(mayor_attack_script(report, victim))
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
                await assert_town_unharmed(nc, attacked, victim_status)
            await _assert_acted_as_itself(town, victim)
            await gt_ok(town, "mayor", "stop")
        server.release()


async def _assert_acted_as_itself(town: TownCli, victim: str) -> None:
    feed = await asyncio.to_thread(town, "feed", "--json", "--no-follow", "--since", "all")
    assert feed.returncode == 0, feed.stderr
    events = [json.loads(line) for line in feed.stdout.splitlines() if line.strip()]
    filed = [e for e in events if e["type"] == "bead.created" and (e.get("data") or {}).get("title") == "Filed as ann"]
    assert [e["actor"] for e in filed] == ["agent:mayor"], filed
    assert not [e for e in events if e.get("actor") == "operator:ann"], "the mayor agent acted as operator:ann"
    assert not [e for e in events if e["type"] == "step.gate_opened"], "the mayor agent opened a gate"
    shown = json.loads(town("bead", "show", victim, "--json").stdout)
    assert shown["status"] == "open", shown
