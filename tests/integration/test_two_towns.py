"""Two towns of one OS user on one tmux socket (the trial's case): each touches only the tmux sessions it made."""

from __future__ import annotations

from pathlib import Path

from nats.aio.client import Client

from services.witness.settings import WitnessSettings
from shared.core.config import TownConfig, town_mark
from shared.host.tmux import Tmux
from tests.conftest import _embedded_server
from tests.helpers import assert_eventually, connected
from tests.witness_town import polecat_town

LONG_AGENT = "sleep 600"
"""An agent that works for as long as the test runs."""


async def test_a_second_town_never_kills_the_firsts_live_session_and_still_kills_its_own_orphans(
    town: TownConfig, nc: Client, tmp_path: Path
) -> None:
    first = WitnessSettings(min_orphan_age_s=60.0, kill_grace_s=1.0)
    second = WitnessSettings(min_orphan_age_s=1.0, kill_grace_s=1.0)
    async with polecat_town(town, nc, tmp_path / "town1", first) as one:
        await one.add_rig(agent_command=LONG_AGENT)
        bead = await one.new_bead("Work for a long time")
        await one.sling(bead)

        def started() -> int:
            sessions = one.sessions_of(bead)
            assert sessions, "no session yet"
            assert sessions[0].status == "started", sessions[0].status
            assert sessions[0].pane_pid
            return sessions[0].pane_pid

        pane_pid = await assert_eventually(started, timeout=60)
        with _embedded_server(tmp_path / "nats2") as server:
            town2 = TownConfig(nats_url=server.url, gt_home=tmp_path / "town2" / "home")
            assert town_mark(town2) != town_mark(town)
            async with (
                connected(town2.nats_url) as nc2,
                polecat_town(town2, nc2, tmp_path / "town2", second, socket=one.socket) as two,
            ):
                assert two.witness is not None
                # The second town's own leftovers: one it marked (a real orphan of its own), and one nobody marked.
                two.tmux.start("gt-demo-stray", "sleep 600", cwd=str(tmp_path), env={}, label="hq-lost-1")
                Tmux(one.socket).start("gt-demo-unmarked", "sleep 600", cwd=str(tmp_path), env={}, label="")
                await assert_eventually(lambda: "gt-demo-stray" not in two.tmux.snapshot(), timeout=30)
                # Many more of its reconciles, each well past its orphan age for the first town's session.
                passes = two.witness.reconciles
                await assert_eventually(lambda: two.witness is not None and two.witness.reconciles >= passes + 10)
                everything = Tmux(one.socket).snapshot()
                assert "gt-demo-unmarked" in everything, "a session no town marked is nobody's orphan"
                live = one.tmux.snapshot()[one.sessions_of(bead)[0].tmux_name]
                assert live.pane_pid == pane_pid, "the same agent, never killed"
                assert not live.dead
                [session] = one.sessions_of(bead)
                assert session.status == "started", one.endings([session])
