"""How the real `gt` behaves as a Unix command: piped into a reader that stops early, an unknown flag, help
text, what a nudge says it did, the head `gt mq list` shows, what `gt down` leaves running."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from gt.embedded_nats import free_port
from shared.host import git
from shared.host.tmux import Tmux
from shared.model.commands import MergeRequestSubmit
from tests.helpers import assert_eventually, wait_until
from tests.integration.test_town import TownCli
from tests.integration.test_witness import started_session
from tests.witness_town import PolecatTown, make_origin, run_gt

EXIT_SIGPIPE = 141
"""What a shell reports for a command a closed pipe stopped (128 + SIGPIPE), like `yes | head -1`."""


def gt_into_closed_pipe(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`gt ...` whose stdout is a pipe nobody reads any more (as `gt ... | head -1` after head has its line):
    every write meets a broken pipe, so the outcome does not depend on timing."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "gt.cli.main", *args],
            env=env,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)


async def test_output_into_a_closed_pipe_ends_quietly(pt: PolecatTown, gt_env: dict[str, str]) -> None:
    await pt.add_rig()
    for title in ("one", "two", "three"):
        await pt.new_bead(title)
    env = {**gt_env, "NATS_URL": pt.config.nats_url}
    for args in (("status",), ("feed", "--no-follow", "--since", "all"), ("bead", "list")):
        done = await asyncio.to_thread(gt_into_closed_pipe, env, *args)
        assert "Traceback" not in done.stderr, (args, done.stderr)
        assert "BrokenPipeError" not in done.stderr, (args, done.stderr)
        assert done.returncode in (0, EXIT_SIGPIPE), (args, done.returncode, done.stderr)
    # And through a real shell pipeline, as typed.
    shell = await asyncio.to_thread(
        subprocess.run,
        ["sh", "-c", f"{sys.executable} -m gt.cli.main feed --no-follow --since all | head -1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert shell.returncode == 0
    assert shell.stdout.count("\n") == 1
    assert "Traceback" not in shell.stderr, shell.stderr


async def test_an_unknown_flag_prints_the_subcommands_usage(gt_env: dict[str, str]) -> None:
    for args, usage in (
        (("bead", "create", "x", "--nosuchflag"), "usage: gt bead create"),
        (("status", "--nosuchflag"), "usage: gt status"),
        (("mq", "list", "--nosuchflag"), "usage: gt mq list"),
        (("down", "--nosuchflag"), "usage: gt down"),
    ):
        done = await run_gt(gt_env, *args)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.startswith(usage), (args, done.stderr)
        assert "unrecognized arguments: --nosuchflag" in done.stderr


async def test_an_unknown_bead_type_is_refused_naming_the_types(gt_env: dict[str, str]) -> None:
    for args in (("bead", "create", "x", "-t", "nonsense"), ("bead", "update", "hq-1", "--type", "bgu")):
        done = await run_gt(gt_env, *args)
        assert done.returncode == 2, (args, done.stderr)
        assert "argument --type/-t: invalid choice:" in done.stderr, done.stderr
        assert "(choose from 'task', 'bug', 'feature', 'chore', 'docs', 'epic'," in done.stderr, done.stderr


async def test_a_call_with_no_town_in_gt_home_says_how_to_start_one(gt_env: dict[str, str], tmp_path: Path) -> None:
    env = {k: v for k, v in gt_env.items() if k != "NATS_URL"}
    home = tmp_path / "no-town"
    done = await run_gt({**env, "GT_HOME": str(home)}, "ready")
    assert done.returncode == 3, done
    assert f"no town is running in GT_HOME ({home}): `gt up -d` starts one there" in done.stderr, done.stderr


async def test_up_help_documents_every_option(gt_env: dict[str, str]) -> None:
    done = await run_gt(gt_env, "up", "--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert re.search(r"--port PORT \w", text), done.stdout
    assert "GT_NATS_PORT" in text


async def test_a_nudge_says_delivered_when_it_was_and_queued_when_it_waits(
    pt: PolecatTown, gt_env: dict[str, str]
) -> None:
    # An agent that reads what is typed into its pane and answers it, and never finishes on its own.
    await pt.add_rig(agent_command="sh -c 'while read line; do echo \"heard: $line\"; done'")
    bead = await pt.new_bead("Listen")
    await pt.sling(bead)
    session_id, _, _ = await started_session(pt, bead, 1)
    env = {**gt_env, "NATS_URL": pt.config.nats_url}
    live = await run_gt(env, "nudge", "demo/ace", "please also update the docs")
    assert live.returncode == 0, live.stderr
    assert f"delivered to {session_id}" in live.stdout, live.stdout
    assert "queued" not in live.stdout

    # Nobody runs in the rig's other name: the nudge waits for a session.
    await pt.ok("gt.cmd.bead.close", id=bead, reason="done by hand")
    await pt.wait_settled(bead)
    later = await run_gt(env, "nudge", "demo/ace", "anyone there?", "--ttl", "60")
    assert later.returncode == 0, later.stderr
    assert "queued for demo/ace" in later.stdout, later.stdout


async def test_mq_list_shows_the_head_that_landed_after_the_rebase(pt: PolecatTown, gt_env: dict[str, str]) -> None:
    await pt.add_rig()
    first, second = await pt.new_bead("A"), await pt.new_bead("B")
    head_a = pt.push_branch("polecat/a/x", {"A.txt": "a\n"})
    head_b = pt.push_branch("polecat/b/x", {"B.txt": "b\n"})
    mr_a = await pt.submit(first, "polecat/a/x", head_a)

    def merged(mr_id: str) -> bool:
        assert pt.refinery is not None
        mr = pt.refinery.projection.state.mrs.get(mr_id)
        return mr is not None and mr.status == "merged"

    await assert_eventually(lambda: merged(mr_a), timeout=90, interval=0.1)
    mr_b = await pt.submit(second, "polecat/b/x", head_b)  # off the old main: rebased onto A's merge
    await assert_eventually(lambda: merged(mr_b), timeout=90, interval=0.1)
    landed = git.git("rev-parse", "refs/heads/main", cwd=pt.origin).strip()
    assert landed != head_b
    env = {**gt_env, "NATS_URL": pt.config.nats_url}
    listed = await run_gt(env, "mq", "list")
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if line.startswith(mr_b))
    assert landed[:10] in row, listed.stdout
    assert head_b[:10] not in row, listed.stdout


async def test_mq_list_lists_merge_requests_in_the_order_they_were_submitted(
    pt: PolecatTown, gt_env: dict[str, str]
) -> None:
    await pt.add_rig()
    submitted = []
    for n, priority in enumerate((3, 0, 2, 1)):  # the refinery takes the most urgent first: not the list's order
        bead = await pt.new_bead(f"Change {n}", priority=priority)
        head = pt.push_branch(f"polecat/p{n}/x", {f"{n}.txt": f"{n}\n"})
        cmd = MergeRequestSubmit(bead=bead, rig="demo", branch=f"polecat/p{n}/x", head=head, priority=priority)
        submitted.append(str((await pt.send(cmd))["id"]))

    def all_merged() -> bool:
        assert pt.refinery is not None
        mrs = pt.refinery.projection.state.mrs  # applied a moment after their outcomes: None until then
        statuses = [mrs[m].status if m in mrs else None for m in submitted]
        assert statuses == ["merged"] * 4, statuses
        return True

    await assert_eventually(all_merged, timeout=120, interval=0.2)
    env = {**gt_env, "NATS_URL": pt.config.nats_url}
    listed = await run_gt(env, "mq", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [row["id"] for row in json.loads(listed.stdout)] == submitted, "oldest first, newest last"
    text = await run_gt(env, "mq", "list")
    table, summary = text.stdout.split("\n\n")
    assert [line.split()[0] for line in table.splitlines()[1:]] == submitted, text.stdout
    assert "merged: 4 in the last hour" in summary, "the board's line under the list"


@pytest.fixture
def gt_town(gt_env: dict[str, str], tmp_path: Path) -> Iterator[TownCli]:
    cli = TownCli(gt_env, tmp_path / "town")
    cli.env["GT_TMUX_SOCKET"] = f"gt-test-{uuid.uuid4().hex[:10]}"
    try:
        yield cli
    finally:
        cli("down")
        Tmux(cli.env["GT_TMUX_SOCKET"]).kill_server()


def slung_in_a_town(gt_town: TownCli, tmp_path: Path, agent: str, title: str) -> tuple[str, Callable[[], list[str]]]:
    """A town up with rig demo (agent ``agent``) and a bead slung to it; the bead, and a look at its polecat panes."""
    tmux = Tmux(gt_town.env["GT_TMUX_SOCKET"])
    origin = make_origin(tmp_path / "project")
    assert gt_town("up", "-d", "--port", "0").returncode == 0
    added = gt_town("rig", "add", "demo", str(origin), "--agent", agent, "--wait")
    assert added.returncode == 0, added.stderr
    bead = gt_town("bead", "create", title, "--prefix", "demo", "--wait").stdout.strip()
    assert gt_town("sling", bead, "demo", "--wait").returncode == 0

    def polecat_panes() -> list[str]:
        return sorted(name for name in tmux.snapshot() if name.startswith("gt-demo-"))

    return bead, polecat_panes


def test_down_counts_the_sessions_left_running_and_down_sessions_stops_them_through_the_witness(
    gt_town: TownCli, tmp_path: Path
) -> None:
    bead, polecat_panes = slung_in_a_town(gt_town, tmp_path, "GT_AGENT_FAULT=hang gt-agent", "Keep working")
    first = wait_until(polecat_panes, timeout=60)
    down = gt_town("down")
    assert down.returncode == 0, down.stderr
    assert "town down" in down.stdout
    assert "1 polecat session keeps running" in down.stdout, down.stdout
    assert "and goes on working" in down.stdout, down.stdout
    assert "gt down --sessions" in down.stdout
    assert polecat_panes() == first, "plain `gt down` leaves sessions alone"

    assert gt_town("up", "-d", "--port", "0").returncode == 0
    stopped = gt_town("down", "--sessions")
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped 1 polecat session" in stopped.stdout, stopped.stdout
    assert "keeps running" not in stopped.stdout
    assert polecat_panes() == [], "stopped before the services went down, not respawned"

    # The log has it, and the next town gives the bead a fresh session.
    assert gt_town("up", "-d", "--port", "0").returncode == 0
    history = gt_town("bead", "history", bead, "--json")
    assert history.returncode == 0, history.stderr
    ended = [e for e in json.loads(history.stdout) if e["type"] == "session.ended"]
    assert [e["data"]["reason"] for e in ended] == ["stopped"], ended
    wait_until(polecat_panes, timeout=60)
    sessions = json.loads(gt_town("session", "list", "--json").stdout)
    assert [s["attempt"] for s in sessions] == [2], sessions


def test_down_sessions_after_the_town_went_down_ends_the_sessions_it_left_running(
    gt_town: TownCli, tmp_path: Path
) -> None:
    """A plain `gt down` left a session running; `gt down --sessions` then, with no town to ask, ends it itself (its
    pane and every process of it), and the next town gives the bead a fresh session."""
    bead, polecat_panes = slung_in_a_town(gt_town, tmp_path, "GT_AGENT_FAULT=hang gt-agent", "Left running")
    [pane] = wait_until(polecat_panes, timeout=60)
    agent_pid = Tmux(gt_town.env["GT_TMUX_SOCKET"]).snapshot()[pane].pane_pid
    assert "1 polecat session keeps running" in gt_town("down").stdout
    ended = gt_town("down", "--sessions")
    assert ended.returncode == 0, ended.stderr
    assert "no town is running" in ended.stdout
    assert "ended 1 polecat session left running without a town" in ended.stdout, ended.stdout
    assert "keeps running" not in ended.stdout, "said once, and not sent round in a circle"
    assert polecat_panes() == []
    assert not psutil.pid_exists(agent_pid) or psutil.Process(agent_pid).status() == psutil.STATUS_ZOMBIE
    assert gt_town("up", "-d", "--port", "0").returncode == 0

    def fresh_session() -> list[int]:
        listed = json.loads(gt_town("session", "list", "--json").stdout)
        return [s["attempt"] for s in listed if s["bead"] == bead and s["status"] == "started"]

    assert wait_until(fresh_session, timeout=120) == [2]


def test_down_sessions_also_ends_an_agent_still_running_after_gt_done(gt_town: TownCli, tmp_path: Path) -> None:
    """An agent goes on after `gt done` (Claude Code does, to read its result): its session is ended, and the witness
    leaves its pane for GT_DONE_EXIT_GRACE. `gt down --sessions` waits for the witness to end it, so no agent is
    left running with nobody to end it."""
    gt_town.env["GT_DONE_EXIT_GRACE"] = "20"
    bead, polecat_panes = slung_in_a_town(gt_town, tmp_path, "gt-agent; exec sleep 3600", "Done, then lingering")

    def done_and_lingering() -> bool:
        listed = json.loads(gt_town("session", "list", "--all", "--json").stdout)
        done = [s for s in listed if s["bead"] == bead and s["end_reason"] == "done" and not s["cleaned"]]
        return bool(done) and bool(polecat_panes())

    wait_until(done_and_lingering, timeout=90, message="the session ended by gt done, its agent still running")
    stopped = gt_town("down", "--sessions")
    assert stopped.returncode == 0, stopped.stderr
    assert "waiting for 1 session that ran `gt done` to exit" in stopped.stderr, stopped.stderr
    assert "keeps running" not in stopped.stdout, stopped.stdout
    assert polecat_panes() == [], "the lingering agent's pane ended before the town went down"


def test_a_gt_agent_session_waits_out_gt_down_and_finishes_its_bead_once_the_town_is_back(
    gt_town: TownCli, tmp_path: Path
) -> None:
    tmux = Tmux(gt_town.env["GT_TMUX_SOCKET"])
    origin = make_origin(tmp_path / "project")
    port = str(free_port())  # the session's `gt` finds the town where it was: the same port after `gt up`
    assert gt_town("up", "-d", "--port", port).returncode == 0
    added = gt_town("rig", "add", "demo", str(origin), "--agent", "GT_AGENT_STEP_PAUSE=2 gt-agent", "--wait")
    assert added.returncode == 0, added.stderr
    bead = gt_town("bead", "create", "Work through a town restart", "--prefix", "demo", "--wait").stdout.strip()
    assert gt_town("sling", bead, "demo", "--wait").returncode == 0

    def pane() -> str:
        names = [name for name in tmux.snapshot() if name.startswith("gt-demo-")]
        return tmux.capture(names[0]) if names else ""

    wait_until(lambda: "step 2 " in pane(), timeout=60, message="the agent is at work")
    down = gt_town("down")
    assert down.returncode == 0, down.stderr
    assert "1 polecat session keeps running in tmux" in down.stdout, down.stdout
    assert "its `gt` calls wait up to 90 s for the town (GT_TOWN_PATIENCE; gt-agent's an hour)" in down.stdout
    wait_until(lambda: "the town does not answer" in pane(), timeout=60, message="the agent says it waits")
    assert "giving up" not in pane()

    assert gt_town("up", "-d", "--port", port).returncode == 0
    seen = [pane()]

    def closed() -> bool:
        seen.append(pane() or seen[-1])  # the witness ends the pane once the session is done
        shown = gt_town("bead", "show", bead, "--json")
        return shown.returncode == 0 and json.loads(shown.stdout)["status"] == "closed"

    wait_until(closed, timeout=180, message="the same session finished the bead and it merged")
    assert any("the town answers again" in text for text in seen), seen[-1]
    sessions = json.loads(gt_town("session", "list", "--bead", bead, "--all", "--json").stdout)
    assert [(s["attempt"], s["end_reason"]) for s in sessions] == [(1, "done")], "no new session, no death"


def test_an_agents_gt_call_waits_out_a_town_restart_saying_so_and_gets_through_once(
    gt_town: TownCli, tmp_path: Path
) -> None:
    """Issue 39: after `gt down` Claude Code's `gt step done` failed at once (`NATS is unreachable`, exit 3) and
    the session idled until its stall limit, though `gt down` had said it would report in once the town was up.
    Every agent's `gt` waits for the town itself (GT_TOWN_PATIENCE, 90 s in a session), says on stderr what it
    waits for, and gets through once the town is back. Here a call with the exact environment of a real session's
    pane (read from /proc), NATS stopped by `gt down` for longer than the old 30 s login patience."""
    origin = make_origin(tmp_path / "project")
    port = str(free_port())
    assert gt_town("up", "-d", "--port", port).returncode == 0
    added = gt_town("rig", "add", "demo", str(origin), "--agent", "GT_AGENT_FAULT=hang gt-agent", "--wait")
    assert added.returncode == 0, added.stderr
    bead = gt_town("bead", "create", "Wait for the town", "--prefix", "demo", "--wait").stdout.strip()
    assert gt_town("sling", bead, "demo", "--wait").returncode == 0

    def started() -> dict[str, Any]:
        listed = gt_town("session", "list", "--bead", bead, "--json")
        sessions = [s for s in json.loads(listed.stdout) if s.get("status") == "started" and s.get("pane_pid")]
        assert sessions, listed.stdout
        return dict(sessions[0])

    session = wait_until(started, timeout=120, message="the session runs")
    molecule = json.loads(gt_town("mol", "status", bead, "--json").stdout)
    step = molecule["steps"][0]["id"]
    # The agent's environment, as the witness gave it: the agent runs below the pane's reaper.
    [agent] = psutil.Process(int(session["pane_pid"])).children()
    raw = Path(f"/proc/{agent.pid}/environ").read_bytes().split(b"\0")
    pane_env = dict(entry.decode().split("=", 1) for entry in raw if b"=" in entry)
    assert pane_env["GT_SESSION"] == session["id"]
    assert "GT_TOWN_PATIENCE" not in pane_env, "the sessions' default patience"

    assert gt_town("down").returncode == 0
    began = time.monotonic()
    call = subprocess.Popen(
        [sys.executable, "-m", "gt.cli.main", "step", "done", step],
        env={**pane_env, "PYTHONPATH": gt_town.env.get("PYTHONPATH", "")},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert call.stderr is not None
        # The first line of `gt`'s own (the session passes GT_LOG_LEVEL on: library logs may come first).
        first = next(line for line in call.stderr if line.startswith("gt: "))
        assert first.startswith("gt: the town does not answer (NATS is unreachable at nats://127.0.0.1:"), first
        assert "waiting up to 90 s for it (GT_TOWN_PATIENCE)" in first, first
        time.sleep(max(0.0, 35 - (time.monotonic() - began)))  # past the 30 s an agent's login used to wait
        assert call.poll() is None, "still waiting"
        assert gt_town("up", "-d", "--port", port).returncode == 0
        _out, err = call.communicate(timeout=120)
    finally:
        if call.poll() is None:
            call.kill()
    assert call.returncode == 0, err
    assert "the town answers again after" in err, err
    assert "Traceback" not in err

    def done_once() -> list[dict[str, Any]]:
        history = json.loads(gt_town("bead", "history", bead, "--json").stdout)
        done = [e for e in history if e["type"] == "step.done" and e["data"].get("step") == step]
        assert done, [e["type"] for e in history]
        return done

    assert len(wait_until(done_once, timeout=60)) == 1
