"""Garbage collection of the projections: what each fold of ``gc.swept`` drops and what it keeps, that the
fold is deterministic (a fresh replay, or a snapshot plus the tail, equals the live projection), when the
deacon sweeps, and which KV entries of dead things it purges. Pure: events are folded as the services do."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import msgspec
import pytest

from services.deacon import decide as deacon_decide
from services.deacon.plan import gc
from services.deacon.projection import new_projection as deacon_projection
from services.deacon.settings import load as load_deacon_settings
from services.deacon.state import DeaconState, GcState
from services.mayor import queries as mayor_queries
from services.mayor.state import MayorState
from services.refinery.decide import decide as refinery_decide
from services.refinery.plan import beads_to_close
from services.refinery.projection import new_projection as refinery_projection
from services.refinery.service import RefineryService
from services.refinery.state import RefineryState
from services.witness.plan import Observed
from services.witness.plan.spawns import held_names
from services.witness.projection import new_projection as witness_projection
from services.witness.state import WitnessState
from shared.bus.lease_kv import Renewal
from shared.bus.topology import owner_of
from shared.core.config import TownConfig
from shared.core.errors import CommandError, QueryError
from shared.core.ids import hook_lease_name
from shared.model import events as ev
from shared.model import heartbeats
from shared.model.commands import GcSweep, MergeRequestRetry, parse_command
from shared.model.decision import DecideContext
from shared.model.queries import mayor, refinery
from shared.service.projection import Projection
from tests.mayor_town import mayor_town
from tests.memory_log import Fed

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
HOUR = 3600.0
S = TypeVar("S", bound=msgspec.Struct)


class Swept(Fed[S]):
    """A projection fed events at the test's clock, whose log can be replayed into fresh projections."""

    def __init__(self, make: Callable[[], Projection[S]]) -> None:
        super().__init__(make(), clock=T0)
        self.make = make

    def sweep(self, ttl_s: float) -> datetime:
        cutoff = self.clock - timedelta(seconds=ttl_s)
        self.add(ev.GcSwept(cutoff=cutoff, ttl_s=ttl_s))
        return cutoff

    def assert_replays(self) -> None:
        """A fresh replay of the whole log, and a snapshot of every prefix plus the rest, equal the live one."""
        fresh = self.make()
        self.log.replay(fresh)
        assert fresh.serialize_state() == self.projection.serialize_state()
        for cut in range(0, self.log.last_seq, max(1, self.log.last_seq // 7)):
            early = self.make()
            for seq, subject, data in self.log.messages[:cut]:
                early.apply(seq, subject, data)
            resumed = self.make()
            assert resumed.restore(early.snapshot("s"), stream_id="s", stream_last_seq=self.log.last_seq)
            self.log.replay(resumed, after=cut)
            assert resumed.serialize_state() == self.projection.serialize_state(), f"resumed after {cut}"


# ---- witness -----------------------------------------------------------------------------------


class Witness(Swept[WitnessState]):
    def __init__(self) -> None:
        super().__init__(witness_projection)
        self.add(ev.RigAdded(rig="demo", repo="/repos/demo.git", prefix="de", agent_command="gt-agent"))

    def session(self, bead: str, polecat: str, attempt: int = 1, *, end: str | None = "done") -> str:
        if bead not in self.state.beads:
            self.add(ev.BeadCreated(bead_id=bead, title=f"work on {bead}"), ev.BeadSlung(bead_id=bead, rig="demo"))
        sid = f"{bead}-{attempt}"
        self.add(
            ev.SessionRequested(
                session_id=sid,
                rig="demo",
                polecat=polecat,
                bead=bead,
                worktree=f"/town/rigs/demo/polecats/{polecat}",
                branch=f"polecat/{polecat}/{bead}",
                tmux_name=f"gt-demo-{polecat}",
                attempt=attempt,
            ),
            ev.SessionStarted(session_id=sid, pane_pid=4242, pid_started=1000.0),
        )
        if end is not None:
            self.add(ev.SessionEnded(session_id=sid, reason=end))
        return sid

    def clean(self, sid: str, *, removed: bool = True) -> None:
        self.add(ev.SessionCleaned(session_id=sid, worktree_removed=removed))

    def close(self, bead: str) -> None:
        self.add(ev.BeadClosed(bead_id=bead, reason="merged"))


def test_the_witness_drops_closed_beads_done_with_and_keeps_everything_still_needed() -> None:
    w = Witness()
    done = w.session("de-done", "ace")
    w.clean(done)
    w.add(ev.MergeRequestSubmitted(mr_id="mr-done", bead="de-done", rig="demo", branch="b", target="main", head="1"))
    w.close("de-done")
    live = w.session("de-live", "bob", end=None)
    w.add(ev.MergeRequestSubmitted(mr_id="mr-live", bead="de-live", rig="demo", branch="b", target="main", head="2"))
    uncleaned = w.session("de-dirty", "cat", end="dead")
    w.close("de-dirty")
    kept_worktree = w.session("de-kept", "dot", end="dead")
    w.add(ev.SessionEscalated(session_id=kept_worktree, reason="respawn_limit"))
    w.clean(kept_worktree, removed=False)  # kept for manual recovery: the name dot stays held
    w.close("de-kept")
    w.add(ev.RigMassDeath(rig="demo", sessions=[done, uncleaned], window_s=30.0))
    old_nudge = ev.NudgeQueued(nudge_id="nu-old", rig="demo", polecat="ace", message="hi", expires_at=T0)
    queued = ev.NudgeQueued(nudge_id="nu-queued", rig="demo", polecat="bob", message="hi", expires_at=T0)
    w.add(old_nudge, ev.NudgeDelivered(nudge_id="nu-old", session=done), queued)
    w.tick(2 * HOUR)
    late = w.session("de-late", "eel")
    w.clean(late)
    w.close("de-late")  # closed after the cutoff below
    w.add(ev.NudgeQueued(nudge_id="nu-fresh", rig="demo", polecat="eel", message="hi", expires_at=w.clock))
    w.add(ev.NudgeExpired(nudge_id="nu-fresh"))
    names_before = _held_names(w)

    w.sweep(HOUR)

    state = w.state
    assert "de-done" not in state.beads
    assert done not in state.sessions
    assert "mr-done" not in state.mr_beads
    assert state.mr_beads["mr-live"] == "de-live"
    assert state.mass_deaths == {"demo": [uncleaned]}
    assert {"de-live", "de-dirty", "de-kept", "de-late"} <= set(state.beads)
    assert {live, uncleaned, kept_worktree, late} <= set(state.sessions)
    assert state.beads["de-live"].sessions == [live]  # a live bead keeps its sessions (their ids count them)
    assert set(state.nudges) == {"nu-queued", "nu-fresh"}  # queued ones wait for the witness to expire them
    assert ("demo", "dot") in names_before
    assert ("demo", "ace") not in names_before
    assert _held_names(w) == names_before  # dot stays held (its worktree is kept); ace was free already
    assert w.projection.snapshot_due
    w.assert_replays()


def _held_names(w: Witness) -> set[tuple[str, str]]:
    """The (rig, polecat) names the planner considers taken: a sweep must not free one."""
    return set(held_names(w.state, Observed(now=w.clock, as_of_seq=w.log.last_seq, panes={})))


def test_a_carried_over_worktree_is_collected_with_the_bead_once_the_last_session_removed_it() -> None:
    w = Witness()
    first = w.session("de-a", "ace", 1, end="handoff")
    w.clean(first, removed=False)  # carried on by the next session
    second = w.session("de-a", "ace", 2)
    w.clean(second)
    w.close("de-a")
    w.tick(HOUR)
    w.sweep(0)
    assert "de-a" not in w.state.beads
    assert first not in w.state.sessions
    assert second not in w.state.sessions
    w.assert_replays()


def test_a_bead_whose_hook_lease_is_still_held_waits_for_its_release() -> None:
    w = Witness()
    sid = w.session("de-a", "ace")
    lease = hook_lease_name("de-a")
    w.add(ev.LeaseAcquired(lease=lease, holder=sid, token=1, ttl_s=60.0, expires_at=T0))
    w.clean(sid)
    w.close("de-a")
    w.tick(HOUR)
    w.sweep(0)
    assert "de-a" in w.state.beads
    assert sid in w.state.sessions
    w.add(ev.LeaseReleased(lease=lease, holder=sid, token=1))
    w.sweep(0)
    assert "de-a" not in w.state.beads
    assert lease not in w.state.hooks
    w.assert_replays()


# ---- mayor -------------------------------------------------------------------------------------


def _mayor_sweep(town: Any, ttl_s: float) -> None:
    town.log.record([ev.GcSwept(cutoff=town.clock - timedelta(seconds=ttl_s), ttl_s=ttl_s)], ts=town.clock)
    town.log.replay(town.projection, after=town.projection.last_seq)


def test_the_mayor_drops_molecules_of_old_closed_beads_and_says_so() -> None:
    town = mayor_town()
    done = town.send("gt.cmd.bead.create", {"title": "Done work"})["id"]
    town.send("gt.cmd.bead.sling", {"id": done, "rig": "demo"})
    town.send("gt.cmd.step.done", {"bead": done, "step": "load-context"})
    town.send("gt.cmd.bead.close", {"id": done, "reason": "merged"})
    live = town.send("gt.cmd.bead.create", {"title": "Live work"})["id"]
    town.send("gt.cmd.bead.sling", {"id": live, "rig": "demo"})
    town.tick(2 * HOUR)
    recent = town.send("gt.cmd.bead.create", {"title": "Recent work"})["id"]
    town.send("gt.cmd.bead.sling", {"id": recent, "rig": "demo"})
    town.send("gt.cmd.bead.close", {"id": recent})

    _mayor_sweep(town, HOUR)

    state: MayorState = town.state
    assert done not in state.molecules
    assert state.beads[done].collected_molecule == "polecat-work"
    assert live in state.molecules
    assert state.beads[live].collected_molecule is None
    assert recent in state.molecules
    assert mayor_queries.answer(state, mayor.Get(id=done)).status == "closed"
    with pytest.raises(QueryError, match="polecat-work molecule was garbage-collected") as found:
        mayor_queries.answer(state, mayor.Molecule(bead=done))
    assert found.value.code == "not_found"
    with pytest.raises(CommandError, match="garbage-collected") as refused:
        town.send("gt.cmd.step.done", {"bead": done, "step": "implement"})
    assert refused.value.code == "conflict"
    assert town.reject_code("gt.cmd.step.start", {"bead": done, "step": "implement"}) == "conflict"
    assert town.reject_code("gt.cmd.bead.sling", {"id": done, "rig": "demo"}) == "backward_transition"
    town.send("gt.cmd.step.done", {"bead": live, "step": "load-context"})  # live work is untouched
    _assert_mayor_replays(town)


def test_closed_wisps_leave_unless_something_refers_to_them() -> None:
    town = mayor_town()
    parent = town.send("gt.cmd.bead.create", {"title": "Patrol"})["id"]
    alone = town.send("gt.cmd.bead.create", {"title": "ping", "type": "wisp", "parent": parent})["id"]
    sibling = town.send("gt.cmd.bead.create", {"title": "pong", "type": "wisp", "parent": parent})["id"]
    needed = town.send("gt.cmd.bead.create", {"title": "needed", "type": "wisp"})["id"]
    town.send("gt.cmd.bead.create", {"title": "blocked", "needs": [needed]})
    tracked = town.send("gt.cmd.bead.create", {"title": "tracked", "type": "wisp"})["id"]
    town.send("gt.cmd.convoy.create", {"title": "c", "beads": [tracked], "owned": True})
    with_child = town.send("gt.cmd.bead.create", {"title": "has a child", "type": "wisp"})["id"]
    town.send("gt.cmd.bead.create", {"title": "child", "parent": with_child})
    open_wisp = town.send("gt.cmd.bead.create", {"title": "still open", "type": "wisp"})["id"]
    for wisp in (alone, sibling, needed, tracked, with_child):
        town.send("gt.cmd.bead.close", {"id": wisp})
    town.tick(HOUR)

    _mayor_sweep(town, 0)

    state: MayorState = town.state
    assert alone not in state.beads
    assert sibling not in state.beads
    assert parent not in state.children  # both children gone: no empty list left behind
    assert {needed, tracked, with_child, open_wisp} <= set(state.beads)
    assert town.reject_code("gt.cmd.bead.create", {"title": "x", "parent": alone}) == "not_found"
    _assert_mayor_replays(town)


def _assert_mayor_replays(town: Any) -> None:
    fresh = mayor_town().projection
    town.log.replay(fresh)
    assert fresh.serialize_state() == town.projection.serialize_state()


# ---- refinery ----------------------------------------------------------------------------------


class Refinery(Swept[RefineryState]):
    def __init__(self) -> None:
        super().__init__(refinery_projection)
        self.add(ev.RigAdded(rig="demo", repo="/repos/demo.git", prefix="de", agent_command="gt-agent"))

    def submit(self, bead: str) -> str:
        self.add(ev.BeadCreated(bead_id=bead, title=bead), ev.BeadSlung(bead_id=bead, rig="demo"))
        mr = f"mr-{bead}"
        self.add(ev.MergeRequestSubmitted(mr_id=mr, bead=bead, rig="demo", branch=f"b/{bead}", target="main", head="1"))
        return mr

    def claim(self, mr: str, attempt: int = 1) -> None:
        self.add(ev.MergeRequestClaimed(mr_id=mr, attempt=attempt, holder="r", lease_until=self.clock))

    def merge(self, mr: str) -> None:
        self.claim(mr)
        self.add(ev.MergeRequestMerged(mr_id=mr, merged_commit="c", target_before="t"))


def test_the_refinery_drops_finished_merge_requests_of_closed_beads_with_their_indexes() -> None:
    r = Refinery()
    merged = r.submit("de-merged")
    r.merge(merged)
    r.add(ev.BeadClosed(bead_id="de-merged"))
    unclosed = r.submit("de-unclosed")
    r.merge(unclosed)  # merged, but the crash before the close left its bead open: the close is still owed
    queued = r.submit("de-queued")
    blocked = r.submit("de-blocked")
    r.claim(blocked)
    command = f"conflict-{blocked}-1"
    r.add(ev.MergeRequestConflicted(mr_id=blocked, target_commit="t", conflict_command=command))
    r.add(ev.CommandAccepted(command_id=command, command="bead.create", result={"id": "de-fix"}))
    failed = r.submit("de-failed")
    r.claim(failed)
    conflict = f"conflict-{failed}-1"
    r.add(ev.MergeRequestConflicted(mr_id=failed, target_commit="t", conflict_command=conflict))
    r.add(ev.CommandAccepted(command_id=conflict, command="bead.create", result={"id": "de-fix2"}))
    r.add(ev.MergeRequestRequeued(mr_id=failed, reason="conflict bead closed"))
    r.claim(failed, 2)
    r.add(ev.MergeRequestFailed(mr_id=failed, gate="test", exit_code=1, escalated=True))
    r.add(ev.BeadClosed(bead_id="de-failed"))
    r.tick(2 * HOUR)
    late = r.submit("de-late")
    r.add(ev.MergeRequestRejected(mr_id=late, reason="not wanted"), ev.BeadClosed(bead_id="de-late"))

    r.sweep(HOUR)

    state = r.state
    assert set(state.mrs) == {unclosed, queued, blocked, late}
    assert state.created == {command: "de-fix"}
    assert [mr.id for mr in beads_to_close(state)] == [unclosed]
    ctx = DecideContext(now=r.clock, command_id="c1", actor="op", new_id=lambda p: p)
    with pytest.raises(CommandError) as gone:
        refinery_decide(state, MergeRequestRetry(id=merged), ctx)
    assert gone.value.code == "not_found"
    service = RefineryService(TownConfig())
    service.projection = r.projection
    with pytest.raises(QueryError):
        service.query(refinery.Mr(id=merged))
    assert {m.id for m in service.query(refinery.Mrs())} == {unclosed, queued, blocked, late}
    r.assert_replays()


# ---- deacon ------------------------------------------------------------------------------------


class Deacon(Swept[DeaconState]):
    def __init__(self) -> None:
        super().__init__(deacon_projection)

    def run(self, name: str, run_id: str, *, finish: bool = True) -> None:
        self.add(
            ev.AutomationFired(automation=name, run_id=run_id, gate="cooldown", reason="due", action="exec", cursor=7)
        )
        if finish:
            self.add(ev.AutomationCompleted(automation=name, run_id=run_id, result="ok"))


def test_the_deacon_drops_old_automation_runs_and_keeps_what_gates_and_fencing_need() -> None:
    d = Deacon()
    d.run("nightly", "run-1")
    d.add(ev.LeaseAcquired(lease="res", holder="alice", token=1, ttl_s=60.0, expires_at=T0))
    d.add(ev.LeaseReleased(lease="res", holder="alice", token=1))
    d.add(ev.LeaseAcquired(lease="gone", holder="bob", token=3, ttl_s=60.0, expires_at=T0))
    d.add(ev.LeaseExpired(lease="gone", holder="bob", token=3, last_renewed=T0))
    d.tick(2 * HOUR)
    d.run("nightly", "run-2")
    d.run("nightly", "run-3", finish=False)
    fired = d.state.automations.automations["nightly"].last_fired_at

    cutoff = d.sweep(HOUR)

    record = d.state.automations.automations["nightly"]
    assert [r.id for r in record.history] == ["run-2"]
    assert record.open is not None
    assert record.open.id == "run-3"
    assert (record.runs, record.completed, record.cursor, record.last_fired_at) == (3, 2, 7, fired)
    assert {name: lease.token for name, lease in d.state.leases.leases.items()} == {"res": 1, "gone": 3}
    swept = d.state.gc
    assert (swept.cutoff, swept.ttl_s, swept.sweeps, swept.version) == (cutoff, HOUR, 1, d.log.last_seq)
    assert swept.last_swept_at == d.clock
    d.assert_replays()


def test_a_sweep_is_due_every_interval_and_appended_on_the_last_one() -> None:
    d = Deacon()
    started = T0 - timedelta(seconds=30)
    assert not gc.due(d.state.gc, T0, 60.0, started)  # never swept: one interval after the deacon began watching
    assert gc.due(d.state.gc, T0 + timedelta(seconds=30), 60.0, started)
    assert not gc.due(d.state.gc, T0 + timedelta(days=1), 0.0, started)  # 0: only `gt gc`
    first = gc.sweep(d.state.gc, T0, 600.0)
    assert first.expected_seq == 0
    assert first.payload == ev.GcSwept(cutoff=T0 - timedelta(seconds=600), ttl_s=600.0)
    d.add(first.payload)  # recorded at the test's clock, T0
    assert not gc.due(d.state.gc, T0 + timedelta(seconds=59), 60.0, started)
    assert gc.due(d.state.gc, T0 + timedelta(seconds=60), 60.0, started)
    assert gc.sweep(d.state.gc, T0, 600.0).expected_seq == d.log.last_seq


def test_gt_gc_sweeps_with_its_ttl_or_the_deacons() -> None:
    state = GcState(version=12)
    accepted = deacon_decide.sweep(state, GcSweep(ttl_s=0.0), T0, 604_800.0)
    assert msgspec.to_builtins(accepted.result) == {"id": "gc", "cutoff": T0.isoformat(), "ttl_s": 0.0, "changed": True}
    assert [e.expected_seq for e in accepted.events] == [12]
    default = deacon_decide.sweep(state, GcSweep(), T0, 604_800.0)
    assert default.result.ttl_s == 604_800.0
    assert default.result.cutoff == (T0 - timedelta(days=7)).isoformat()
    assert owner_of(GcSweep.SUBJECT) == "deacon"
    assert parse_command("gt.cmd.gc.sweep", b"{}") == GcSweep()
    for bad in (b'{"ttl_s": -1}', b'{"ttl_s": 1e300}', b'{"ttl": 5}'):
        with pytest.raises(CommandError) as refused:
            parse_command("gt.cmd.gc.sweep", bad)
        assert refused.value.code == "invalid"


def test_gc_settings_read_from_the_environment() -> None:
    default = load_deacon_settings({})
    assert (default.gc_ttl_s, default.gc_interval_s) == (604_800.0, 3600.0)
    chosen = load_deacon_settings({"GT_GC_TTL": "0", "GT_GC_INTERVAL": "0"})
    assert (chosen.gc_ttl_s, chosen.gc_interval_s) == (0.0, 0.0)
    with pytest.raises(ValueError, match="GT_GC_TTL"):
        load_deacon_settings({"GT_GC_TTL": "-5"})
    with pytest.raises(ValueError, match="GT_GC_INTERVAL"):
        load_deacon_settings({"GT_GC_INTERVAL": "soon"})


def test_a_snapshot_is_due_after_a_sweep_only_where_asked() -> None:
    d = Deacon()
    d.add(ev.LeaseAcquired(lease="res", holder="alice", token=1, ttl_s=60.0, expires_at=T0))
    assert not d.projection.snapshot_due
    d.sweep(0)
    assert d.projection.snapshot_due
    plain = Projection("plain", DeaconState, lambda *a: None, schema_version=1)
    d.log.replay(plain)
    assert not plain.snapshot_due


# ---- KV entries of dead things -----------------------------------------------------------------


def _renewal(holder: str, token: int, at: datetime, *, expired: bool = False) -> bytes:
    return msgspec.json.encode(Renewal(holder=holder, token=token, renewed_at=at, expired=expired))


def test_lease_entries_of_released_and_expired_leases_are_selected_live_ones_are_not() -> None:
    d = Deacon()
    d.add(ev.LeaseAcquired(lease="held", holder="a", token=1, ttl_s=60.0, expires_at=T0))
    d.add(ev.LeaseAcquired(lease="released", holder="a", token=1, ttl_s=60.0, expires_at=T0))
    d.add(ev.LeaseReleased(lease="released", holder="a", token=1))
    d.add(ev.LeaseAcquired(lease="expired", holder="a", token=2, ttl_s=60.0, expires_at=T0))
    d.add(ev.LeaseExpired(lease="expired", holder="a", token=2, last_renewed=T0))
    d.add(ev.LeaseAcquired(lease="renewed-late", holder="a", token=1, ttl_s=60.0, expires_at=T0))
    d.add(ev.LeaseReleased(lease="renewed-late", holder="a", token=1))
    d.add(ev.LeaseAcquired(lease="newer", holder="a", token=1, ttl_s=60.0, expires_at=T0))
    d.add(ev.LeaseReleased(lease="newer", holder="a", token=1))
    cutoff = T0 + timedelta(hours=1)
    entries = {
        "held": (_renewal("a", 1, T0), 1),
        "released": (_renewal("a", 1, T0), 2),
        "expired": (_renewal("a", 2, T0, expired=True), 3),
        "renewed-late": (_renewal("a", 1, cutoff + timedelta(seconds=1)), 4),
        "newer": (_renewal("b", 2, T0), 5),  # acquired again, not applied here yet
        "unknown": (_renewal("a", 1, T0), 6),
        "garbage": (b"not json", 7),
    }
    assert gc.select_leases(d.state.leases, entries, cutoff) == [("released", 2), ("expired", 3)]


def test_agent_heartbeats_older_than_the_cutoff_are_selected() -> None:
    def beat(at: datetime) -> bytes:
        return msgspec.json.encode({"ts": at.isoformat(), "session": "s", "note": ""})

    entries = {
        "old": (beat(T0 - timedelta(days=8)), 1),
        "fresh": (beat(T0 + timedelta(seconds=1)), 2),
        "naive": (msgspec.json.encode({"ts": "2020-01-01T00:00:00"}), 3),
        "garbage": (b"{", 4),
    }
    assert gc.select_heartbeats(entries, T0) == [("old", 1), ("naive", 3)]


def test_stopped_service_processes_are_selected_once_the_log_recorded_the_stop() -> None:
    d = Deacon()
    d.add(ev.ServiceUp(service="mayor", instance="2-new", pid=2))
    d.add(ev.ServiceUp(service="witness", instance="3-a", pid=3))

    def beat(service: str, instance: str, at: datetime, *, stopping: bool) -> bytes:
        return heartbeats.encode(
            heartbeats.ServiceHeartbeat(
                service=service, instance=instance, pid=1, host="h", started_at=at, ts=at, stopping=stopping
            )
        )

    old = T0 - timedelta(days=8)
    entries = {
        "mayor.1-old": (beat("mayor", "1-old", old, stopping=True), 1),
        "mayor.2-new": (beat("mayor", "2-new", T0, stopping=False), 2),
        "witness.3-a": (beat("witness", "3-a", old, stopping=True), 3),  # its stop is not recorded yet
        "refinery.4-b": (beat("refinery", "4-b", old, stopping=False), 4),  # crashed: the bucket's TTL takes it
        "odd": (b"?", 5),
    }
    assert gc.select_services(d.state.liveness, entries, T0) == [("mayor.1-old", 1)]
