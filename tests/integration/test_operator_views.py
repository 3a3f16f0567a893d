"""``gt status``, ``gt feed`` and ``gt bead history`` against a scripted town: real NATS, the mayor, witness
and refinery, a polecat in real tmux and a merge into a real git origin. The text is compared with golden
files in tests/golden/ after masking what changes from run to run (ids, times, ages, sequences).

Regenerate the golden files with ``GT_UPDATE_GOLDEN=1 ./dev test tests/integration/test_operator_views.py``
and read the diff before committing it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from nats.aio.client import Client

from gt.embedded_nats import EmbeddedServer
from shared.core.config import TownConfig
from tests.drivers import send_and_wait
from tests.helpers import assert_eventually, connected, gt_run
from tests.integration.test_mayor_service import run_mayor
from tests.witness_town import PolecatTown, polecat_town

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
_TIME = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?(\+00:00|Z)?")
_CLOCK = re.compile(r"(?<=\s)\d\d:\d\d:\d\d(?=\s)")
_AGE = re.compile(r"(?<![\w-])\d+(?:s|m\d\ds|h\d\dm|d\d\dh)(?![\w-])")
_SEQ = re.compile(r"#\d+")
_HEX = re.compile(r"\b[0-9a-f]{10,40}\b")


@dataclass
class Scripted:
    pt: PolecatTown
    env: dict[str, str]
    names: dict[str, str]
    """Volatile id -> the name the golden files use."""

    def gt(self, *args: str) -> subprocess.CompletedProcess[str]:
        return gt_run(self.env, *args, timeout=60)

    async def agt(self, *args: str) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(self.gt, *args)

    def mask(self, text: str) -> str:
        for real, name in sorted(self.names.items(), key=lambda kv: -len(kv[0])):
            text = text.replace(real, name)
        text = _TIME.sub("<time>", text)
        text = _CLOCK.sub("<clock>", text)
        text = _SEQ.sub("#<seq>", text)
        text = _HEX.sub("<commit>", text)
        text = _AGE.sub("<age>", text)
        text = re.sub(r"pid \d+", "pid <pid>", text)
        text = re.sub(r"seq \d+", "seq <n>", text)
        # The services' positions in the log depend on what they wrote by the time they were asked.
        text = re.sub(r"(?m)^(  (?:mayor|witness|refinery|deacon) .*?)\d+(.*?)\d+$", r"\1<n>\2<n>", text)
        # Columns padded to a volatile value's width: compare the words, not the spaces between them.
        return "\n".join(re.sub(r" {2,}", "  ", line.rstrip()) for line in text.splitlines()) + "\n"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("GT_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; run with GT_UPDATE_GOLDEN=1 to write it"
    assert text == path.read_text(), f"{name} differs from its golden file:\n{text}"


@pytest.fixture
async def scripted(town: TownConfig, nc: Client, tmp_path: Path, gt_env: dict[str, str]) -> AsyncIterator[Scripted]:
    """The town after a short, fixed story:

    - rig ``demo`` (two polecats at most) whose agent sleeps: its polecat stays at its first step;
    - bead ALPHA slung to it (no convoy): a polecat works it, with a heartbeat;
    - beads BRAVO and CHARLIE with ALPHA in convoy ONE; BRAVO closed by hand;
    - CHARLIE's branch submitted and merged by the refinery;
    - escalation ESC raised about BRAVO.
    """
    async with polecat_town(town, nc, tmp_path) as pt:
        env = {**gt_env, "NATS_URL": town.nats_url, "GT_HOME": str(town.gt_home), "GT_LOG_LEVEL": "ERROR"}
        s = Scripted(pt, env, {})
        await pt.add_rig("demo", agent_command="sleep 600", max_polecats=2)
        alpha = await pt.new_bead("Teach the mayor to count")
        bravo = await pt.new_bead("Sweep the yard")
        charlie = await pt.new_bead("Paint the fence")
        convoy = await pt.ok("gt.cmd.convoy.create", title="Spring cleaning", beads=[alpha, bravo, charlie])
        s.names.update({alpha: "ALPHA", bravo: "BRAVO", charlie: "CHARLIE", str(convoy["id"]): "ONE"})
        await pt.sling(alpha, no_convoy=True)

        def working() -> str:
            sessions = pt.sessions_of(alpha)
            assert sessions, "no session yet"
            assert sessions[-1].status == "started", sessions
            return sessions[-1].id

        session = await assert_eventually(working, timeout=60)

        def claimed() -> bool:  # by the witness, for its polecat, right after the pane started
            assert pt.mayor is not None
            return pt.mayor.projection.state.beads[alpha].status == "in_progress"

        await assert_eventually(claimed, timeout=60)
        s.names[session] = "SESSION"
        s.names[pt.sessions_of(alpha)[-1].polecat] = "POLECAT"
        kv = await nc.jetstream().key_value(town.heartbeat_bucket)
        beat = {"ts": datetime.now(UTC).isoformat(), "session": session, "note": "thinking"}
        await kv.put(session, json.dumps(beat).encode())

        await pt.ok("gt.cmd.bead.close", id=bravo, reason="swept by hand")
        head = pt.push_branch("polecat/charlie", {"fence.txt": "painted\n"})
        mr = await pt.submit(charlie, "polecat/charlie", head)
        s.names[mr] = "MR"

        def merged() -> bool:
            assert pt.refinery is not None
            found = pt.refinery.projection.state.mrs.get(mr)
            return found is not None and found.status == "merged"

        await assert_eventually(merged, timeout=60)
        escalation = await pt.ok("gt.cmd.escalation.raise", severity="high", message="the yard is flooded", bead=bravo)
        s.names[str(escalation["id"])] = "ESC"

        def charlie_closed() -> bool:
            assert pt.mayor is not None
            return pt.mayor.projection.state.beads[charlie].status == "closed"

        await assert_eventually(charlie_closed, timeout=60)
        yield s


async def test_status_shows_the_town_at_a_glance_and_says_which_service_is_missing(scripted: Scripted) -> None:
    run = await scripted.agt("status")
    # The deacon is not running in this town: status says so and exits 1 (a degraded town).
    assert run.returncode == 1, run.stderr
    check_golden("status.txt", scripted.mask(run.stdout))
    assert "\x1b[" not in run.stdout, "no colour when piped"

    coloured = await scripted.agt("status", "--color", "always")
    assert "\x1b[32m" in coloured.stdout, "colour when asked for"
    assert scripted.mask(re.sub(r"\x1b\[[0-9;]*m", "", coloured.stdout)) == scripted.mask(run.stdout)

    snap = json.loads((await scripted.agt("status", "--json")).stdout)
    assert snap["services"]["deacon"]["state"] == "not answering"
    assert snap["services"]["mayor"]["state"] == "healthy"
    [convoy] = snap["convoys"]
    assert (convoy["closed"], convoy["total"]) == (2, 3)
    [polecat] = snap["polecats"]
    assert polecat["state"] == "working"
    assert polecat["heartbeat_age_s"] is not None
    assert snap["merge_queue"]["demo"]["counts"] == {"merged": 1}


async def test_feed_shows_the_backlog_filtered_by_bead_rig_type_and_actor(scripted: Scripted) -> None:
    alpha = next(real for real, name in scripted.names.items() if name == "ALPHA")
    by_bead = await scripted.agt("feed", "--since", "all", "--no-follow", "--bead", alpha)
    assert by_bead.returncode == 0, by_bead.stderr
    check_golden("feed-bead.txt", scripted.mask(by_bead.stdout))

    merges = await scripted.agt("feed", "--since", "all", "--no-follow", "--type", "mr")
    check_golden("feed-type-mr.txt", scripted.mask(merges.stdout))

    by_rig = await scripted.agt("feed", "--since", "all", "--no-follow", "--rig", "demo", "--json")
    types = [json.loads(line)["type"] for line in by_rig.stdout.splitlines()]
    assert "session.started" in types
    assert "mr.merged" in types
    assert "rig.added" in types
    assert "bead.created" not in types, "a bead belongs to a rig only once slung"
    charlie = next(real for real, name in scripted.names.items() if name == "CHARLIE")
    events = [json.loads(line) for line in by_rig.stdout.splitlines()]
    closes = [e for e in events if e["type"] == "bead.closed"]
    assert [e["data"]["bead_id"] for e in closes] == [charlie], "the close of the rig's bead, not of BRAVO"
    # Begun before --since: the refinery's merge requests tell the feed which rig the bead's close is of.
    later = await scripted.agt("feed", "--since", f"#{closes[0]['seq']}", "--no-follow", "--rig", "demo", "--json")
    assert [json.loads(line)["type"] for line in later.stdout.splitlines()][:1] == ["bead.closed"], later.stdout

    by_actor = await scripted.agt("feed", "--since", "all", "--no-follow", "--actor", "nobody-at-all")
    assert by_actor.returncode == 0
    assert by_actor.stdout == ""

    bad = await scripted.agt("feed", "--since", "yesterday")
    assert bad.returncode == 2
    assert "--since 'yesterday'" in bad.stderr


async def test_feed_follows_new_events_after_the_backlog(scripted: Scripted) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gt.cli.main",
        "feed",
        "--since",
        "#1",
        "--type",
        "bead.created",
        env={**scripted.env, "PYTHONFAULTHANDLER": "1"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        # As typed in a terminal. A suite started in the background (`./dev test &`, nohup) hands its children
        # SIGINT ignored, and a gt started so rightly ignores Ctrl-C, as a shell's background job does.
        preexec_fn=functools.partial(signal.signal, signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stderr is not None
        assert proc.stdout is not None
        said = await asyncio.wait_for(proc.stderr.readline(), 60)
        assert b"caught up" in said
        backlog = [await asyncio.wait_for(proc.stdout.readline(), 10) for _ in range(3)]
        assert all(b"created" in line for line in backlog), backlog
        await scripted.pt.new_bead("Arrived while following")
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert b'"Arrived while following"' in line
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
        rest = await _exit_output(proc)
    # Ctrl-C is how a feed ends: no traceback, the shell's code for it.
    assert proc.returncode == 130, rest
    assert b"Traceback" not in rest


async def _exit_output(proc: asyncio.subprocess.Process, deadline: float = 60.0) -> bytes:
    """The stderr of a process told to stop. One that has not exited by the deadline prints its asyncio tasks'
    stacks (SIGUSR2) and its threads' (faulthandler, on SIGABRT), and the test fails with them: where it hung."""
    try:
        _, rest = await asyncio.wait_for(proc.communicate(), deadline)
    except TimeoutError:
        proc.send_signal(signal.SIGUSR2)  # gt prints its asyncio tasks' stacks
        await asyncio.sleep(2)  # a moment to print them before the abort
        proc.send_signal(signal.SIGABRT)
        _, dump = await asyncio.wait_for(proc.communicate(), 30)
        said = dump.decode()[-12000:]
        raise AssertionError(f"gt feed did not exit within {deadline:g}s of Ctrl-C:\n{said}") from None
    return rest


async def test_bead_history_tells_the_story_of_a_merged_and_a_worked_bead(scripted: Scripted) -> None:
    charlie = next(real for real, name in scripted.names.items() if name == "CHARLIE")
    alpha = next(real for real, name in scripted.names.items() if name == "ALPHA")
    merged = await scripted.agt("bead", "history", charlie)
    assert merged.returncode == 0, merged.stderr
    check_golden("history-merged.txt", scripted.mask(merged.stdout))
    worked = await scripted.agt("bead", "history", alpha)
    check_golden("history-worked.txt", scripted.mask(worked.stdout))
    raw = await scripted.agt("bead", "history", alpha, "--json")
    types = [e["type"] for e in json.loads(raw.stdout)]
    assert types[0] == "bead.created"
    assert "session.started" in types
    assert "lease.acquired" in types
    missing = await scripted.agt("bead", "history", "gt-nosuchbead")
    assert missing.returncode == 1
    assert "no events for bead" in missing.stderr


async def test_convoy_sling_cooks_every_open_bead_with_a_progress_bar_and_names_each_refusal(
    scripted: Scripted,
) -> None:
    pt = scripted.pt
    beads = [await pt.new_bead(f"Bulk bead {i}") for i in range(40)]
    convoy = str((await pt.ok("gt.cmd.convoy.create", title="Bulk", beads=beads))["id"])
    await pt.ok("gt.cmd.bead.close", id=beads[0], reason="not needed")
    await pt.sling(beads[1], no_convoy=True)
    scripted.env["GT_PROGRESS"] = "always"
    run = await scripted.agt("convoy", "sling", convoy, "demo")
    assert run.returncode == 0, run.stdout
    assert run.stdout.strip() == f"{convoy}: 38 slung to demo, 2 not open (left as they were)"
    bars = [line for line in run.stderr.splitlines() if line.startswith(f"slinging {convoy} to demo [")]
    assert bars, run.stderr
    assert bars[-1].endswith("38/38 100%")
    assert pt.mayor is not None
    state = pt.mayor.projection.state
    assert all(state.beads[b].status != "open" for b in beads)
    assert all(state.molecules.get(b) is not None for b in beads[1:]), "each slung bead has its molecule cooked"

    again = await scripted.agt("convoy", "sling", convoy, "demo", "--json")
    assert json.loads(again.stdout)["skipped"] == 40

    late = await pt.new_bead("Late to the party")
    await pt.ok("gt.cmd.convoy.add", id=convoy, beads=[late])
    refused = await scripted.agt("convoy", "sling", convoy, "demo", "--formula", "no-such-formula")
    assert refused.returncode == 1
    assert f"{late}: rejected:" in refused.stdout


async def test_feed_follows_through_a_nats_restart_and_starts_at_a_time(
    own_nats_server: EmbeddedServer, gt_env: dict[str, str], tmp_path: Path
) -> None:
    town = TownConfig(nats_url=own_nats_server.url, gt_home=tmp_path / "home")
    env = {**gt_env, "NATS_URL": town.nats_url, "GT_HOME": str(town.gt_home), "GT_LOG_LEVEL": "ERROR"}

    async def create(nc: Client, title: str) -> None:
        cmd_id = f"t-{uuid.uuid4().hex[:10]}"
        body = json.dumps({"title": title, "cmd_id": cmd_id}).encode()
        outcome = await send_and_wait(nc, "gt.cmd.bead.create", body, cmd_id, timeout=60)
        assert outcome["type"] == "cmd.accepted", outcome

    async with connected(town.nats_url) as nc, run_mayor(town):
        await create(nc, "Before the feed")
        later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
        nothing = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "gt.cli.main", "feed", "--since", later, "--no-follow"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (nothing.returncode, nothing.stdout) == (0, ""), nothing.stderr

        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gt.cli.main", "feed", "--since", "1h", "--type", "bead.created",
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            assert proc.stderr is not None
            assert b"caught up" in await asyncio.wait_for(proc.stderr.readline(), 60)
            assert b'"Before the feed"' in await asyncio.wait_for(proc.stdout.readline(), 10)
            await asyncio.to_thread(own_nats_server.restart)
            await create(nc, "After NATS came back")
            line = await asyncio.wait_for(proc.stdout.readline(), 90)
            assert b'"After NATS came back"' in line, line
        finally:
            proc.terminate()
            rest, _ = await proc.communicate()
        assert b"Before the feed" not in rest, "nothing printed twice"
