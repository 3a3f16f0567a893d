"""The mayor agent's pane attacks (issue 43), shared by the laptop town's test (test_mayor_agent_attacks.py) and the
compose topology's (test_agent_attacks.py, on its stack): the scripted model's conversation that has the real Claude
Code in the mayor agent's pane run tests/attacks/nats_pane.py with its own identity, file a bead naming another
operator as its actor and try to approve a gate; and what is judged of the town afterwards."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from nats.aio.client import Client

from gt.model_server import Script, bash, say, use
from tests.agent_runtimes import RUNTIMES
from tests.attack_checks import assert_log_unforged, assert_taken_id_refused
from tests.attacks import nats_pane

CLAUDE = next(agent for agent in RUNTIMES if agent.name == "claude")
ATTACK = "attack the town"


def mayor_attack_script(script: Path, report: Path, victim: str) -> Script:
    """``victim``: the victim bead's id, or shell text that prints it (``$(cat FILE)``)."""
    attacks = f"python {shlex.quote(str(script))} {shlex.quote(str(report))} {victim} - - && echo attacked"
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


async def assert_town_unharmed(
    nc: Client, report: dict[str, Any], victim_status: str, forged_commands: tuple[str, ...]
) -> None:
    js = nc.jetstream()
    await assert_log_unforged(nc, forged_commands)
    assert (await js.stream_info("KV_GT_HEARTBEATS")).config.name == "KV_GT_HEARTBEATS"
    await assert_taken_id_refused(nc, report)
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


def assert_acted_as_itself(events: list[dict[str, Any]]) -> None:
    """The log (`gt feed --json`): the bead it filed naming operator:ann is the mayor agent's, nothing is
    operator:ann's, no gate was opened."""
    filed = [e for e in events if e["type"] == "bead.created" and (e.get("data") or {}).get("title") == "Filed as ann"]
    assert [e["actor"] for e in filed] == ["agent:mayor"], filed
    assert not [e for e in events if e.get("actor") == "operator:ann"], "the mayor agent acted as operator:ann"
    assert not [e for e in events if e["type"] == "step.gate_opened"], "the mayor agent opened a gate"
