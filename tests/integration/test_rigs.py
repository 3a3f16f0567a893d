"""Rigs change and go, and hooks come back, through the `gt` command against a real town (nats-server, mayor,
witness and refinery, agents in real tmux, real git): slings to unknown rigs are refused, `gt unsling` gives a
bead back, `gt rig update|remove|park|unpark` change a rig without renaming it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from shared.core.config import TownConfig
from shared.core.ids import hook_lease_name
from shared.host import git
from shared.model.events import decode_envelope
from tests.helpers import assert_eventually
from tests.integration.test_cli import Gt, Run
from tests.log_tools import read_all
from tests.witness_town import PolecatTown, make_origin

HANG = "GT_AGENT_FAULT=hang@1 gt-agent"
HANG_ALWAYS = "GT_AGENT_FAULT=hang gt-agent"


@pytest.fixture
def gt(gt_env: dict[str, str], town: TownConfig) -> Gt:
    return Gt(gt_env, town)


def ok(run: Run) -> str:
    assert run.code == 0, (run.code, run.out, run.err)
    return run.out


async def event_types(pt: PolecatTown, subject: str) -> list[str]:
    return [decode_envelope(data).type for _seq, _subject, data in await read_all(pt.nc, "GT_EVT", subject)]


async def event_data(pt: PolecatTown, subject: str, type_: str) -> list[dict[str, object]]:
    out = []
    for _seq, _subject, data in await read_all(pt.nc, "GT_EVT", subject):
        env = decode_envelope(data)
        if env.type == type_:
            out.append(msgspec.json.decode(env.data))
    return out


async def started(pt: PolecatTown, bead: str, attempt: int = 1) -> str:
    """The id of the bead's session ``attempt`` once it is started."""

    def check() -> str:
        sessions = pt.sessions_of(bead)
        assert len(sessions) >= attempt, f"no session {attempt} of {bead} yet"
        assert sessions[attempt - 1].status == "started", sessions[attempt - 1].status
        return sessions[attempt - 1].id

    found: str = await assert_eventually(check, timeout=60, interval=0.05)
    return found


def cleaned(pt: PolecatTown, bead: str, attempt: int) -> bool:
    s = pt.sessions_of(bead)[attempt - 1]
    assert (s.status, s.end_reason, s.cleaned) == ("ended", "unslung", True), (s.status, s.end_reason, s.cleaned)
    return True


async def patrols_pass(pt: PolecatTown, passes: int = 3) -> None:
    """Until the witness finished ``passes`` more patrols: whatever it owed by now, it has done."""
    assert pt.witness is not None
    target = pt.witness.reconciles + passes
    await assert_eventually(lambda: pt.witness is not None and pt.witness.reconciles >= target, timeout=60)


# ---- 5: slings to unknown rigs, and unsling -----------------------------------------------------


async def test_a_sling_to_an_unknown_rig_is_refused_naming_the_rigs(pt: PolecatTown, gt: Gt) -> None:
    bead = await pt.new_bead("Goes nowhere")
    none_yet = await gt("sling", bead, "nosuchrig")
    assert none_yet.code == 1, none_yet.out
    assert "not_found" in none_yet.err
    assert "no rigs yet; add one with gt rig add" in none_yet.err
    await pt.add_rig("demo")
    await pt.add_rig("other", agent_command=HANG)
    refused = await gt("sling", bead, "nosuchrig")
    assert refused.code == 1, refused.out
    assert "no rig 'nosuchrig'; rigs: demo, other" in refused.err
    assert await event_types(pt, f"gt.evt.bead.{bead}") == ["bead.created"], "nothing recorded on the bead"
    assert "hooked on other" in ok(await gt("sling", bead, "other"))


async def test_unsling_ends_the_live_session_and_the_bead_can_be_slung_again(pt: PolecatTown, gt: Gt) -> None:
    # Every attempt hangs: an agent that worked would commit before the unsling reached it (quick since `gt` runs
    # through the client helper), and its unpushed commits would keep the worktree the last part removes.
    await pt.add_rig(agent_command=HANG_ALWAYS)
    bead = await pt.new_bead("Slung by mistake")
    await pt.sling(bead)
    first = await started(pt, bead)
    session = pt.sessions_of(bead)[0]
    out = ok(await gt("unsling", bead, "--reason", "wrong rig"))
    assert f"{bead}: open" in out
    assert first in out, "it says which session the witness ends"

    def ended() -> bool:
        s = pt.sessions_of(bead)[0]
        assert (s.status, s.end_reason, s.cleaned) == ("ended", "unslung", True), (s.status, s.end_reason)
        assert session.tmux_name not in pt.tmux.snapshot(), "its tmux session is gone"
        return True

    await assert_eventually(ended, timeout=60)
    assert pt.mayor is not None
    assert pt.witness is not None
    assert pt.mayor.projection.state.beads[bead].status == "open"
    assert pt.witness.state.hooks[hook_lease_name(bead)].status == "released"
    assert Path(session.worktree).exists(), "the worktree is kept"
    assert not pt.witness.state.sessions[first].worktree_removed
    assert pt.mayor.projection.state.beads[bead].slings == 1, "no re-sling: unslung is no death"
    assert not pt.mayor.projection.state.escalations
    unslung = await event_data(pt, f"gt.evt.bead.{bead}", "bead.unslung")
    assert [(u["rig"], u["reason"]) for u in unslung] == [("demo", "wrong rig")]
    assert "not hooked" in (await gt("unsling", bead)).err

    # Slung again: a fresh session in the same worktree, on the same branch. Asked to remove a worktree that
    # holds uncommitted work, the witness keeps it and says so.
    ok(await gt("sling", bead, "demo"))
    await started(pt, bead, 2)
    again = pt.sessions_of(bead)[1]
    assert (again.worktree, again.branch) == (session.worktree, session.branch)
    unsaved = Path(session.worktree) / "notes.txt"
    unsaved.write_text("not committed yet\n")
    ok(await gt("unsling", bead, "--remove-worktree"))
    await assert_eventually(lambda: cleaned(pt, bead, 2), timeout=60)
    assert not pt.sessions_of(bead)[1].worktree_removed
    assert unsaved.exists(), "uncommitted work is never removed"
    history = ok(await gt("bead", "history", bead))
    assert "has uncommitted changes" in history
    assert "it is kept" in history

    # Once nothing is unsaved there, the worktree goes when asked.
    unsaved.unlink()
    ok(await gt("sling", bead, "demo"))
    await started(pt, bead, 3)
    ok(await gt("unsling", bead, "--remove-worktree"))
    await assert_eventually(lambda: cleaned(pt, bead, 3), timeout=60)
    assert pt.sessions_of(bead)[2].worktree_removed
    assert not Path(session.worktree).exists()
    assert [s.end_reason for s in pt.sessions_of(bead)] == ["unslung"] * 3


# ---- 6: rig update, remove, park, unpark --------------------------------------------------------


async def test_rig_update_changes_the_agent_for_new_sessions_only(pt: PolecatTown, gt: Gt) -> None:
    await pt.add_rig(agent_command=HANG)
    old = await pt.new_bead("Started before the update")
    await pt.sling(old)
    running = await started(pt, old)
    out = ok(await gt("rig", "update", "demo", "--agent", "gt-agent", "--stall-after", "900"))
    assert "agent_command='gt-agent'" in out
    assert "stall_after_s=900" in out
    updated = await event_data(pt, "gt.evt.rig.demo", "rig.updated")
    assert len(updated) == 1
    assert {k for k in updated[0] if k != "rig"} == {"agent_command", "stall_after_s"}, "only the changed fields"
    unchanged = await gt("rig", "update", "demo", "--agent", "gt-agent")
    assert "unchanged" in ok(unchanged)
    assert len(await event_data(pt, "gt.evt.rig.demo", "rig.updated")) == 1

    new = await pt.new_bead("Started after the update")
    await pt.sling(new)
    await pt.wait_merge_requested(new)  # the new agent works it through
    assert pt.witness is not None
    assert pt.witness.state.sessions[running].status == "started", "the running session keeps its agent"
    shown = (await gt("rig", "show", "demo", "--json")).json()
    assert (shown["agent_command"], shown["stall_after_s"]) == ("gt-agent", 900.0)
    bad = await gt("rig", "update", "demo", "--max-polecats", "0")
    assert bad.code == 1
    assert "max_polecats" in bad.err
    missing = await gt("rig", "update", "nosuchrig", "--agent", "x")
    assert missing.code == 1
    assert "not_found" in missing.err


async def test_rig_update_with_an_empty_gate_env_clears_it(pt: PolecatTown, gt: Gt) -> None:
    # `--gate-env ""` names no variable, as its help says: the gates see the allowlist only again.
    await pt.add_rig(gate_env=["CI_CACHE_URL"])
    out = ok(await gt("rig", "update", "demo", "--gate-env", ""))
    assert "gate_env=[]" in out
    shown = (await gt("rig", "show", "demo", "--json")).json()
    assert shown["gate_env"] == []


async def test_rig_remove_is_refused_while_work_is_hooked_and_force_parks_it(pt: PolecatTown, gt: Gt) -> None:
    await pt.add_rig(agent_command=HANG)
    bead = await pt.new_bead("Still working")
    await pt.sling(bead)
    running = await started(pt, bead)
    refused = await gt("rig", "remove", "demo")
    assert refused.code == 1
    assert "conflict" in refused.err
    assert f"rig demo has work hooked: {bead}" in refused.err
    assert "--force" in refused.err
    assert "rig.removed" not in await event_types(pt, "gt.evt.rig.demo")
    ok(await gt("rig", "remove", "demo", "--force"))
    await patrols_pass(pt)
    assert pt.witness is not None
    assert pt.witness.state.sessions[running].status == "started", "a running session finishes its work"
    listed = (await gt("rig", "list", "--json")).json()
    assert [r["name"] for r in listed] == []
    other = await pt.new_bead("After the removal")
    gone = await gt("sling", other, "demo")
    assert gone.code == 1
    assert "rejected (not_found): rig 'demo' was removed; no rigs yet" in gone.err


async def test_park_stops_new_sessions_and_unpark_resumes(pt: PolecatTown, gt: Gt) -> None:
    await pt.add_rig()
    ok(await gt("rig", "park", "demo"))
    bead = await pt.new_bead("Waits for the unpark")
    slung = ok(await gt("sling", bead, "demo"))
    assert "parked" in slung
    await patrols_pass(pt)
    assert pt.sessions_of(bead) == [], "a parked rig starts no session"
    listed = (await gt("rig", "list", "--json")).json()
    assert [(r["name"], r["parked"], r["waiting_beads"]) for r in listed] == [("demo", True, 1)]
    assert "parked" in ok(await gt("rig", "list"))
    status = await gt("status")  # exit 1: no deacon runs in this town; the rigs are shown all the same
    assert [line.split() for line in status.out.splitlines() if "(parked)" in line] == [
        ["demo", "(parked)", "0/4", "1", "0", "-"]  # and no tokens, no cost yet
    ]
    assert ok(await gt("rig", "unpark", "demo")).strip() == "rig demo: active; the waiting bead gets a session now"
    await pt.wait_merge_requested(bead)
    shown = ok(await gt("rig", "show", "demo")).splitlines()
    assert "git_name: {rig}/{polecat} (default)" in shown, shown
    assert "git_email: {polecat}.{rig}@gastown.invalid (default)" in shown, shown
    assert await event_types(pt, "gt.evt.rig.demo") == ["rig.added", "rig.parked", "rig.unparked"]


async def test_a_name_kept_by_a_failed_start_is_free_again_once_its_bead_is_closed(
    pt: PolecatTown, gt: Gt, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GT_CLAUDE_BIN", str(tmp_path / "no-such-claude"))  # the witness cannot start its agent
    await pt.add_rig(agent_command="claude")
    first = await pt.new_bead("Needs an agent that is not there")
    await pt.sling(first)

    def kept() -> str:
        sessions = pt.sessions_of(first)
        assert len(sessions) == 1, sessions
        session = sessions[0]
        assert (session.status, session.end_reason, session.escalated) == (
            "ended",
            "failed_to_start",
            "agent_unavailable",
        )
        assert session.cleaned, "not cleaned yet"
        assert not session.worktree_removed, "kept for manual recovery"
        return session.id

    failed = await assert_eventually(kept, timeout=60)
    assert pt.sessions_of(first)[0].polecat == "ace"

    def raised() -> Any:
        assert pt.mayor is not None
        found = [e for e in pt.mayor.projection.state.escalations.values() if e.bead == first]
        assert found, "not raised yet"
        return found[0]

    escalation = await assert_eventually(raised, timeout=30)
    assert escalation.status == "open"

    ok(await gt("bead", "close", first, "--reason", "not needed after all"))

    def freed() -> bool:
        session = pt.sessions_of(first)[0]
        assert session.worktree_removed, "the name is still held"
        assert pt.mayor is not None
        closed = pt.mayor.projection.state.escalations[escalation.id]
        assert (closed.status, closed.closed_by) == ("closed", "mayor"), "its escalation is still open"
        assert closed.close_reason == f"resolved: bead {first} closed: not needed after all"
        return True

    await assert_eventually(freed, timeout=60)
    ok(await gt("rig", "update", "demo", "--agent", "gt-agent"))
    second = await pt.new_bead("Works with gt-agent")
    await pt.sling(second)
    await pt.wait_merge_requested(second)
    assert [s.polecat for s in pt.sessions_of(second)] == ["ace"], "the name the failed start had is free again"
    assert failed not in [s.id for s in pt.sessions_of(second)]


def merged(pt: PolecatTown, bead: str) -> bool:
    assert pt.mayor is not None
    found = pt.mayor.projection.state.beads[bead]
    assert found.status == "closed", f"{bead} is {found.status}"
    return True


def main_files(origin: Path) -> str:
    return git.git("ls-tree", "-r", "--name-only", "main", cwd=origin)


async def test_a_removed_rigs_name_is_added_again_as_a_new_rig_with_none_of_the_old_ones_work(
    pt: PolecatTown, gt: Gt, tmp_path: Path
) -> None:
    """Issue 39: `gt rig add` of a removed rig's name was refused for good. Added again it is a new rig: its own
    repository and directory, no bead, session or merge request of the old one."""
    ok(await gt("rig", "add", "demo", str(pt.origin), "--prefix", "old", "--test", "true", "--wait"))
    first = await pt.new_bead("Lands in the first project")
    await pt.sling(first)
    await assert_eventually(lambda: merged(pt, first), timeout=120, interval=0.2)
    assert f".gastown-work/{first}/" in main_files(pt.origin)
    assert pt.refinery is not None
    [old_mr] = [m for m in pt.refinery.projection.state.mrs.values() if m.bead == first]
    # Work left hooked at the removal keeps the name from being added again, until it is given back.
    ok(await gt("rig", "update", "demo", "--agent", HANG_ALWAYS))
    left = await pt.new_bead("Left hooked")
    await pt.sling(left)
    running = await started(pt, left)
    blocker = await pt.new_bead("Blocks the held one")
    held = await pt.new_bead("Held for the old rig", needs=[blocker])
    assert "held" in ok(await gt("sling", held, "demo", "--hold"))
    ok(await gt("rig", "remove", "demo", "--force"))
    second_origin = make_origin(tmp_path / "second")
    refused = await gt("rig", "add", "demo", str(second_origin), "--prefix", "new")
    assert refused.code == 1, refused.out
    assert f"removed rig demo still has work: beads still hooked to it: {left}; sessions still running: {running}" in (
        refused.err
    )
    ok(await gt("unsling", left))
    await assert_eventually(lambda: cleaned(pt, left, 1), timeout=60)
    # Another rig cannot take the old prefix; the rig's own new incarnation may take a new one.
    taken = await gt("rig", "add", "other", str(second_origin), "--prefix", "old")
    assert taken.code == 1
    assert "bead prefix 'old' is rig demo's" in taken.err
    again = ok(await gt("rig", "add", "demo", str(second_origin), "--prefix", "new", "--test", "true", "--wait"))
    assert "demo" in again
    assert [r["name"] for r in (await gt("rig", "list", "--json")).json()] == ["demo"]
    shown = (await gt("rig", "show", "demo", "--json")).json()
    assert (shown["repo"], shown["prefix"], shown["incarnation"], shown["removed"]) == (
        str(second_origin), "new", 2, False,
    )  # fmt: skip

    # The new rig works in its own directory on its own project; the bead given back is not taken up.
    ok(await gt("rig", "update", "demo", "--agent", "gt-agent"))
    second = await pt.new_bead("Lands in the second project", prefix="new")
    await pt.sling(second)
    await assert_eventually(lambda: merged(pt, second), timeout=120, interval=0.2)
    [session] = pt.sessions_of(second)
    assert "/rigs/demo.2/polecats/" in session.worktree, session.worktree
    assert f".gastown-work/{second}/" in main_files(second_origin)
    assert f".gastown-work/{second}/" not in main_files(pt.origin), "nothing of the new rig's lands in the old"
    assert len(pt.sessions_of(left)) == 1, "the old rig's bead was given back and is not the new rig's"
    assert pt.mayor is not None
    assert pt.mayor.projection.state.beads[left].status == "open"
    # A bead held for the old rig is not slung to the new one when its blocker closes: it is open, held no more.
    ok(await gt("bead", "close", blocker))
    await patrols_pass(pt)
    shown = (await gt("bead", "show", held, "--json")).json()
    assert (shown["status"], shown["slings"], shown.get("hold")) == ("open", 0, None), shown
    # The old rig's merge requests stay its own: not retried into the new rig, not in its queue.
    retried = await gt("mq", "retry", old_mr.id)
    assert retried.code == 1
    assert "was submitted to rig demo before it was removed" in retried.err
    status = (await gt("status", "--json")).json()
    assert status["merge_queue"]["demo"]["counts"] == {"merged": 1}, status["merge_queue"]
    everything = (await gt("status", "--all", "--json")).json()
    assert everything["merge_queue"]["demo"]["counts"] == {"merged": 2}, everything["merge_queue"]


async def test_a_bead_filed_for_a_rig_takes_its_prefix_and_keeps_its_id_when_slung(pt: PolecatTown, gt: Gt) -> None:
    """Issue 39: `--prefix` said "bead id prefix for the rig's beads", yet every bead slung to the rig was `hq-`."""
    await pt.add_rig("demo", prefix="dm", agent_command=HANG)
    bead = ok(await gt("bead", "create", "For the demo rig", "--rig", "demo")).strip()
    assert bead.startswith("dm-"), bead
    ok(await gt("sling", bead, "demo"))
    session = await started(pt, bead)
    shown = (await gt("bead", "show", bead, "--json")).json()
    assert (shown["rig"], shown["hook_session"]) == ("demo", session), "the session on its hook, first one too"
    assert f"session:   {session}" in ok(await gt("bead", "show", bead))
    plain = ok(await gt("bead", "create", "Town-level")).strip()
    assert plain.startswith("hq-"), plain
    unknown = await gt("bead", "create", "Nowhere", "--rig", "nosuch")
    assert unknown.code != 0
    assert "no rig 'nosuch'" in unknown.err
    both = await gt("bead", "create", "Both", "--rig", "demo", "--prefix", "x")
    assert both.code == 2
    assert "not allowed with argument" in both.err
    helped = " ".join(ok(await gt("rig", "add", "--help")).split())
    assert "`claude` (Claude Code:" in helped
    assert "`codex` (Codex CLI:" in helped
    assert "`gemini` (Gemini CLI:" in helped
    assert "`gt-agent` (the reference agent, the default), or any other command line" in helped
    assert "filed with `gt bead create --rig NAME`" in helped
