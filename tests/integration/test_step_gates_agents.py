"""A real agent at a closed gate: Claude Code and Codex CLI, driven by the scripted model server through a real town,
work up to a step that waits on an operator's approval, are refused that step (``gate_closed``, naming the gate)
and `gt done` past it from their pane, stop, and are ended by the witness as ``gate_wait`` (no death). The operator
approves with a note; a fresh session of the same runtime reads the note in its `gt prime`, works the rest and the
bead merges."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from gt.model_server import ModelServer, Script, bash, say, use
from services.witness.settings import WitnessSettings
from shared.core.config import TownConfig
from shared.host import git
from tests.agent_runtimes import RUNTIMES, AgentCli
from tests.helpers import assert_eventually
from tests.integration.test_runtime_conformance import merged, runtime_under_test
from tests.witness_town import PolecatTown, polecat_town

AGENTS = [agent for agent in RUNTIMES if agent.name in ("claude", "codex")]
FORMULA = """formula = "approved-work"
[[steps]]
id = "prepare"
title = "Prepare {{bead}}"
[[steps]]
id = "approval"
title = "Ship it once approved"
needs = ["prepare"]
wait = { human = "May {{bead}} ship?" }
[[steps]]
id = "submit"
title = "Submit"
needs = ["approval"]
"""


@pytest.fixture(params=AGENTS, ids=[agent.name for agent in AGENTS])
def cli(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> AgentCli:
    return runtime_under_test(request, monkeypatch)


@pytest.fixture
async def pt(town: TownConfig, nc: Client, tmp_path: Path) -> AsyncIterator[PolecatTown]:
    settings = WitnessSettings(min_orphan_age_s=60.0, kill_grace_s=1.0, gate_quiet_s=3.0)
    async with polecat_town(town, nc, tmp_path, settings) as handle:
        yield handle


async def test_an_agent_stops_at_a_closed_gate_and_a_fresh_one_goes_on_once_an_operator_approves(
    pt: PolecatTown, cli: AgentCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    (pt.config.gt_home / "formulas").mkdir(parents=True, exist_ok=True)
    (pt.config.gt_home / "formulas" / "approved-work.formula.toml").write_text(FORMULA)
    await pt.add_rig(agent_command=cli.name, stall_after_s=600.0)
    name = f"{cli.name}-gated"
    bead = await pt.new_bead(f"Gated [model-script:{name}]")
    at_the_gate = Script(
        name=name,
        turns=(
            use(bash("gt prime", expect="Current step: prepare")),
            use(bash("gt step done prepare", expect="prepare: done")),
            use(bash("gt step done approval", expect="waits on its gate, an operator's approval")),
            # Handing the work in past the gate, as a hostile agent would try: refused.
            use(bash("gt done", expect="gate_closed")),
            say("The next step waits for an operator's approval; I stop here."),
        ),
    )
    after_it = Script(
        name=name,
        turns=(
            use(bash("gt prime", expect="an operator approved it: ship the docs only")),
            use(
                bash(
                    f"echo approved > approved.txt && git add approved.txt && git commit -q -m '{bead}: approved' && "
                    "gt step done approval && gt step done submit && gt done",
                    expect="merge request",
                )
            ),
            say("Submitted to the merge queue."),
        ),
    )
    async with ModelServer([at_the_gate]) as server:
        for variable, value in cli.witness_env(server.base_url).items():
            monkeypatch.setenv(variable, value)
        try:
            await pt.sling(bead, formula="approved-work")

            def ended_at_the_gate() -> bool:
                sessions = pt.sessions_of(bead)
                assert len(sessions) == 1, pt.endings(sessions)
                assert sessions[0].status == "ended", (sessions[0].status, sessions[0].warrant_reason)
                return True

            await assert_eventually(ended_at_the_gate, timeout=180)
            [first] = pt.sessions_of(bead)
            assert first.end_reason == "gate_wait", (first.end_reason, first.end_detail)
            assert server.failures == [], server.failures
            server.add(after_it)
            await pt.ok("gt.cmd.gate.approve", bead=bead, step="approval", note="ship the docs only")
            sessions = await merged(pt, server, bead)
        finally:
            server.release()
    assert [s.end_reason for s in sessions] == ["gate_wait", "done"], pt.endings(sessions)
    assert git.git("show", "main:approved.txt", cwd=pt.origin) == "approved\n"
