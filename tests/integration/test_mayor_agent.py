"""The mayor agent (issue 43) with the real Claude Code, driven by the scripted model server through a real town:
`gt mayor start` has the witness launch it in its own pane, primed with the town; `gt mayor ask --wait` types a
request in when it is at its prompt and prints its answer. Asked to add a mean and then a median function to rig
calc, it files two beads (the second needing the first) and a convoy, and slings the convoy: the beads merge in that
order, and every command it sent is in the log as ``agent:mayor``. Killed mid-turn, it is launched again, primed
again, and the request it was working on is typed into the new session."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from nats.aio.client import Client

from gt.model_server import Fault, ModelServer, Script, bash, say, use
from services.witness.settings import WitnessSettings
from shared.core.config import TownConfig
from shared.model.commands import TownAgentStart
from tests.agent_runtimes import RUNTIMES, AgentCli
from tests.helpers import assert_eventually, gt_run
from tests.witness_town import PolecatTown, polecat_town

CLAUDE = next(agent for agent in RUNTIMES if agent.name == "claude")
ASK = "add a mean and then a median function to rig calc"


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch) -> AgentCli:
    CLAUDE.binary()  # fails (never skips) naming ./dev setup when it is missing
    monkeypatch.delenv("GT_AGENT_ENV", raising=False)
    return CLAUDE


@pytest.fixture
async def pt(town: TownConfig, nc: Client, tmp_path: Path) -> AsyncIterator[PolecatTown]:
    settings = WitnessSettings(min_orphan_age_s=60.0, kill_grace_s=1.0)
    async with polecat_town(town, nc, tmp_path, settings) as handle:
        yield handle


def _env(pt: PolecatTown, gt_env: dict[str, str]) -> dict[str, str]:
    return {**gt_env, "NATS_URL": pt.config.nats_url, "GT_HOME": str(pt.config.gt_home), "GT_TMUX_SOCKET": pt.socket}


def primed() -> tuple:  # type: ignore[type-arg]
    """The start of every conversation of the mayor agent: it runs `gt prime`, says it is ready and waits."""
    return (
        use(bash("gt prime", expect="You are the mayor agent")),
        say("I know the town now. Ready for requests."),
    )


def filing() -> Script:
    made = (
        'a=$(gt bead create "Add a mean function" --rig calc -d "mean(xs) in stats.py, with a test") && '
        'b=$(gt bead create "Add a median function" --rig calc -d "median(xs) in stats.py, with a test" '
        '--needs "$a") && c=$(gt convoy create "Mean, then median" "$a" "$b") && gt convoy sling "$c" calc && '
        'echo "filed $a then $b in $c"'
    )
    return Script(
        name="mayor-filing",
        turns=(
            *primed(),
            use(bash("gt rig list && gt ready", expect="calc"), prompt=ASK),
            use(bash(made, expect="filed ")),
            say("Filed two beads (the median needs the mean) in one convoy and slung it to calc."),
        ),
    )


async def _ask(env: dict[str, str], text: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(gt_run, env, "mayor", "ask", text, *extra)


def _log(pt: PolecatTown, env: dict[str, str]) -> list[dict[str, Any]]:
    """Every event of the log as `gt feed --json` has it (type, actor, data)."""
    out = gt_run(env, "feed", "--json", "--no-follow", "--since", "all")
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


async def test_the_mayor_agent_files_two_dependent_beads_and_a_convoy_and_they_merge_in_order(
    pt: PolecatTown, cli: AgentCli, monkeypatch: pytest.MonkeyPatch, gt_env: dict[str, str]
) -> None:
    await pt.add_rig("calc", agent_command="gt-agent", stall_after_s=600.0)
    env = _env(pt, gt_env)
    async with ModelServer([filing()], default="mayor-filing") as server:
        for variable, value in cli.witness_env(server.base_url).items():
            monkeypatch.setenv(variable, value)
        try:
            started = await asyncio.to_thread(gt_run, env, "mayor", "start")
            assert started.returncode == 0, started.stderr
            assert "mayor agent started (claude)" in started.stdout
            asked = await _ask(env, ASK, "--wait", "--timeout", "240")
            assert asked.returncode == 0, (asked.stdout, asked.stderr, server.failures)
            assert "Filed two beads" in asked.stdout
            assert server.failures == [], server.failures

            def both_merged() -> list[str]:
                assert pt.refinery is not None
                merged = sorted(
                    (m for m in pt.refinery.projection.state.mrs.values() if m.status == "merged"),
                    key=lambda m: m.ended_at or m.submitted_at,
                )
                assert len(merged) == 2, [(m.bead, m.status) for m in pt.refinery.projection.state.mrs.values()]
                return [m.bead for m in merged]

            order = await assert_eventually(both_merged, timeout=240, interval=0.5)
        finally:
            server.release()
            await asyncio.to_thread(gt_run, env, "mayor", "stop")
    assert pt.mayor is not None
    beads = pt.mayor.projection.state.beads
    titles = ("Add a mean function", "Add a median function")
    mean, median = (next(b for b in beads.values() if b.title == title) for title in titles)
    assert order == [mean.id, median.id]
    assert median.needs == [mean.id]
    [convoy] = [c for c in pt.mayor.projection.state.convoys.values() if c.title == "Mean, then median"]
    assert convoy.beads == [mean.id, median.id]
    by_mayor = {
        (str(e["type"]), str((e.get("data") or {}).get("bead_id") or (e.get("data") or {}).get("convoy_id") or ""))
        for e in _log(pt, env)
        if e.get("actor") == "agent:mayor"
    }
    assert ("bead.created", mean.id) in by_mayor
    assert ("bead.created", median.id) in by_mayor
    assert any(kind == "convoy.created" for kind, _ in by_mayor), by_mayor
    assert any(kind == "bead.slung" for kind, _ in by_mayor), by_mayor


def _agent_process(pt: PolecatTown) -> psutil.Process:
    """The mayor agent's runtime (claude) in its pane."""
    assert pt.witness is not None
    agent = pt.witness.state.town_agents["mayor"]
    assert agent.pane_pid is not None
    pane = psutil.Process(agent.pane_pid)
    found = [p for p in pane.children(recursive=True) if "claude" in " ".join(p.cmdline())]
    assert found, [p.cmdline() for p in pane.children(recursive=True)]
    return found[0]


async def test_the_mayor_agent_killed_mid_turn_is_launched_again_primed_and_given_the_request_again(
    pt: PolecatTown, cli: AgentCli, monkeypatch: pytest.MonkeyPatch, gt_env: dict[str, str]
) -> None:
    await pt.add_rig("calc", agent_command="gt-agent")
    env = _env(pt, gt_env)
    script = Script(
        name="mayor-killed",
        turns=(
            *primed(),
            # The first time this turn is asked for, the model never answers: the agent is killed meanwhile.
            use(bash("gt ready", expect="(no beads)"), prompt="what is ready", faults=(Fault(kind="stall", times=1),)),
            say("Nothing is ready right now."),
        ),
    )
    async with ModelServer([script], default="mayor-killed") as server:
        for variable, value in cli.witness_env(server.base_url).items():
            monkeypatch.setenv(variable, value)
        try:
            assert (await asyncio.to_thread(gt_run, env, "mayor", "start")).returncode == 0
            asked = await _ask(env, "what is ready to work on")
            assert asked.returncode == 0, asked.stderr
            assert pt.witness is not None

            def stalled_in_the_turn() -> bool:
                assert server.stalled == 1, (server.stalled, server.failures)
                return True

            await assert_eventually(stalled_in_the_turn, timeout=180)
            first = _agent_process(pt)
            os.kill(first.pid, signal.SIGKILL)

            def launched_again() -> bool:
                agent = pt.witness.state.town_agents["mayor"]  # type: ignore[union-attr]
                assert agent.run == 2, agent.run
                return True

            await assert_eventually(launched_again, timeout=60)

            def answered() -> bool:
                agent = pt.witness.state.town_agents["mayor"]  # type: ignore[union-attr]
                assert agent.asks == [], agent.asks
                return True

            await assert_eventually(answered, timeout=180)
        finally:
            server.release()
            await asyncio.to_thread(gt_run, env, "mayor", "stop")
    primes = [r for r in server.requests if r.kind == "turn" and r.turn == 0]
    assert len(primes) >= 2, [(r.kind, r.turn) for r in server.requests]  # a fresh conversation, primed again
    events = [e for e in _log(pt, env) if str(e["type"]).startswith("town_agent.")]
    kinds = [str(e["type"]) for e in events]
    assert kinds.count("town_agent.launched") == 2, kinds
    delivered = [e["data"]["run"] for e in events if e["type"] == "town_agent.ask_delivered"]
    assert delivered[-1:] == [2], kinds  # typed again into the new session (into the first too, as far as seen)
    answer = [e for e in _log(pt, env) if e["type"] == "town_agent.answered"]
    assert [str((a.get("data") or {}).get("text")) for a in answer] == ["Nothing is ready right now."]


async def test_a_mayor_agent_that_cannot_be_launched_is_retried_with_backoff_then_escalated_and_no_link_followed(
    pt: PolecatTown, cli: AgentCli, tmp_path: Path
) -> None:
    """Its folder swapped for a link by the agent (to a directory the witness, as root, would write into): never
    followed; the launch fails, is tried again with backoff, and the third failure in a row is escalated."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    agents = pt.config.gt_home / "agents"
    agents.mkdir(parents=True, exist_ok=True)
    (agents / "agent-mayor").symlink_to(elsewhere)
    await pt.send(TownAgentStart())

    def escalated() -> str:
        assert pt.mayor is not None
        found = [e.message for e in pt.mayor.projection.state.escalations.values() if e.source == "witness"]
        assert found, "no escalation yet"
        return found[0]

    message = await assert_eventually(escalated, timeout=120)
    assert "could not be launched 3 times in a row" in message
    assert "is not a directory of the mayor agent's own" in message
    assert list(elsewhere.iterdir()) == []  # nothing written through the link
    assert pt.witness is not None
    assert pt.witness.state.town_agents["mayor"].run == 0


async def test_mail_to_the_mayor_and_an_escalation_are_typed_in_when_it_waits_and_it_acts_on_them(
    pt: PolecatTown, cli: AgentCli, monkeypatch: pytest.MonkeyPatch, gt_env: dict[str, str], tmp_path: Path
) -> None:
    env = _env(pt, gt_env)
    mail_id, escalation_id = tmp_path / "mail-id", tmp_path / "escalation-id"
    script = Script(
        name="mayor-told",
        turns=(
            *primed(),
            use(bash(f'gt mail read "$(cat {mail_id})"', expect="ship on Friday"), prompt="[gastown mail from"),
            say("Read the operator's mail."),
            use(
                bash(f'gt escalation ack "$(cat {escalation_id})"', expect="acked"),
                prompt="[gastown escalation",
            ),
            say("Acknowledged it."),
        ),
    )
    async with ModelServer([script], default="mayor-told") as server:
        for variable, value in cli.witness_env(server.base_url).items():
            monkeypatch.setenv(variable, value)
        try:
            assert (await asyncio.to_thread(gt_run, env, "mayor", "start")).returncode == 0

            def waiting_at_its_prompt() -> bool:
                assert [r.turn for r in server.requests if r.kind == "turn"][-1:] == [1], server.failures
                return True

            await assert_eventually(waiting_at_its_prompt, timeout=120)
            sent = await asyncio.to_thread(
                gt_run, env, "mail", "send", "mayor", "--subject", "Release?", "--body", "Can it ship on Friday?"
            )
            assert sent.returncode == 0, sent.stderr
            mail_id.write_text(sent.stdout.split(":")[0].strip())
            assert pt.mayor is not None

            def read() -> bool:
                assert pt.mayor is not None
                assert "read" in pt.mayor.projection.state.beads[mail_id.read_text()].labels, server.failures
                return True

            await assert_eventually(read, timeout=120)
            raised = await asyncio.to_thread(gt_run, env, "escalate", "CI runners are slow", "--severity", "medium")
            assert raised.returncode == 0, raised.stderr
            escalation_id.write_text(raised.stdout.strip())

            def acked() -> bool:
                assert pt.mayor is not None
                status = pt.mayor.projection.state.escalations[escalation_id.read_text()].status
                assert status == "acked", (status, server.failures)
                return True

            await assert_eventually(acked, timeout=120)
        finally:
            server.release()
            await asyncio.to_thread(gt_run, env, "mayor", "stop")
    assert server.failures == [], server.failures
    told = [str(e["data"]["notice"]) for e in _log(pt, env) if e["type"] == "town_agent.told"]
    assert told == [mail_id.read_text(), escalation_id.read_text()]
