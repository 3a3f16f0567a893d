"""The envelope, the two-step decode, unknown types and upcasters."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

import msgspec
import pytest

from shared.core.errors import EventDecodeError, UnknownEventTypeError
from shared.model import events as ev
from shared.model.events.gate_jobs import GateCommand, GateResult
from shared.model.usage import ModelUsage

TS = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)

SAMPLES: list[ev.Event] = [
    ev.BeadCreated(bead_id="hq-1", title="t", labels=["a"], metadata={"k": ""}, needs=["hq-0"], parent="hq-0"),
    ev.BeadUpdated(bead_id="hq-1", title="new", assignee=None, add_labels=["b"], metadata={"x": "y"}),
    ev.BeadClaimed(bead_id="hq-1", assignee="max"),
    ev.BeadClosed(bead_id="hq-1", reason="done"),
    ev.CommandAccepted(
        command_id="c1",
        command="bead.create",
        events=[ev.EventRef(id="e", type="bead.created", subject="s")],
        result={},
    ),
    ev.CommandRejected(command_id="c2", command="bead.close", code="not_found", message="no bead"),
    ev.BeadSlung(bead_id="hq-1", rig="demo", session="demo-ace", forced=True, convoy_id="cv-1"),
    ev.BeadSlung(bead_id="hq-2", rig="demo", forced=True, ignored_blockers=["hq-1"]),
    ev.BeadSlung(bead_id="hq-3", rig="demo", held_for=["hq-1", "hq-2"]),
    ev.BeadHeld(bead_id="hq-3", rig="demo", blockers=["hq-1", "hq-2"]),
    ev.BeadSlung(bead_id="hq-4", rig="demo", agent="codex"),
    ev.BeadHeld(bead_id="hq-4", rig="demo", blockers=["hq-1"], agent="gemini"),
    ev.BeadUnslung(bead_id="hq-1", rig="demo", reason="wrong rig", remove_worktree=True),
    ev.MoleculeAttached(
        bead_id="hq-1",
        formula="polecat-work",
        formula_version=2,
        source="builtin:polecat-work.formula.toml",
        vars={"x": "y"},
        steps=[ev.StepSpec(id="a", title="A", needs=[]), ev.StepSpec(id="b", title="B", needs=["a"], acceptance="ok")],
    ),
    ev.StepStarted(bead_id="hq-1", step="a"),
    ev.StepCompleted(bead_id="hq-1", step="a"),
    ev.GateOpened(bead_id="hq-1", step="a", by="operator", detail="ship it"),
    ev.MoleculeCompleted(bead_id="hq-1"),
    ev.ReworkAdded(
        bead_id="hq-1",
        mr_id="mr-1",
        sent_back_by="evt-1",
        round=1,
        reason="conflict",
        steps=[ev.StepSpec(id="rework-1-rebase", title="Rebase"), ev.StepSpec(id="rework-1-submit", title="Submit")],
    ),
    ev.ConvoyCreated(convoy_id="cv-1", title="Work", beads=["hq-1"], owned=True, auto=True),
    ev.ConvoyBeadsAdded(convoy_id="cv-1", beads=["hq-2"]),
    ev.ConvoyClosed(convoy_id="cv-1", landed=True, forced=True, closed_beads=1, total_beads=2),
    ev.EscalationRaised(escalation_id="esc-1", severity="high", source="refinery", message="red", bead="hq-1"),
    ev.EscalationAcked(escalation_id="esc-1", by="operator:max"),
    ev.EscalationReescalated(escalation_id="esc-1", from_severity="high", to_severity="critical", level=1),
    ev.EscalationClosed(escalation_id="esc-1", by="operator:max", reason="fixed"),
    ev.RigAdded(
        rig="demo",
        repo="/srv/git/demo.git",
        prefix="demo",
        test_command="make test",
        agent_command="gt-agent",
        max_polecats=2,
        max_respawns=5,
        stall_after_s=90.5,
    ),
    ev.RigMassDeath(rig="demo", sessions=["demo-1-1", "demo-2-1", "demo-3-1"], window_s=30.0),
    ev.RigUpdated(rig="demo", agent_command="claude", max_polecats=8, stall_after_s=900.0, gate_pristine=True),
    ev.RigParked(rig="demo", reason="CI is down"),
    ev.RigUnparked(rig="demo"),
    ev.RigRemoved(rig="demo", hooked=["demo-1"]),
    ev.SessionRequested(
        session_id="demo-1-2",
        rig="demo",
        polecat="ace",
        bead="demo-1",
        worktree="/t/rigs/demo/polecats/ace",
        branch="polecat/ace/demo-1",
        tmux_name="gt-demo-ace",
        attempt=2,
        handoff_of="demo-1-1",
    ),
    ev.SessionStarted(session_id="demo-1-2", pane_pid=4242, pid_started=1763900000.25, adopted=True),
    ev.SessionDoneIntent(session_id="demo-1-2"),
    ev.SessionWarranted(session_id="demo-1-2", reason="zombie", detail="agent gone"),
    ev.SessionEnded(session_id="demo-1-2", reason="zombie", detail="killed after warrant"),
    ev.SessionCleaned(session_id="demo-1-2", worktree_removed=False, detail="kept"),
    ev.SessionEscalated(session_id="demo-1-2", reason="respawn_limit"),
    ev.SessionHookRecovered(session_id="demo-1-2", bead="demo-1", token=2, resolution="resling", detail="clean"),
    ev.SessionUsage(
        session_id="demo-1-2",
        rig="demo",
        bead="demo-1",
        models=(ModelUsage(model="claude-opus-4-5", input_tokens=3, output_tokens=40, messages=1),),
        final=True,
    ),
    ev.TownAgentStarted(name="mayor", agent="claude"),
    ev.TownAgentStopped(name="mayor"),
    ev.TownAgentLaunched(name="mayor", run=2, tmux_name="gt_agent_mayor", pane_pid=42, pid_started=1.5),
    ev.TownAgentAsked(name="mayor", ask_id="ask-1", text="add a mean function", asked_by="operator"),
    ev.TownAgentAskDelivered(name="mayor", ask_id="ask-1", run=2),
    ev.TownAgentAnswered(name="mayor", ask_id="ask-1", text="filed hq-aaaaaa"),
    ev.TownAgentTold(name="mayor", notice="hq-bbbbbb"),
    ev.CrewAdded(rig="demo", name="ann", branch="crew/ann", workspace="/town/rigs/demo/crew/ann"),
    ev.CrewReady(rig="demo", name="ann"),
    ev.CrewHooked(rig="demo", name="ann", bead="hq-aaaaaa"),
    ev.CrewRemoved(rig="demo", name="ann"),
    ev.CrewWorkspaceRemoved(rig="demo", name="ann", removed=False, detail="kept: uncommitted changes"),
    ev.NudgeQueued(nudge_id="nd-1", rig="demo", polecat="ace", session="demo-1-2", message="hi", expires_at=TS),
    ev.NudgeDelivered(nudge_id="nd-1", session="demo-1-2", attempts=2),
    ev.NudgeExpired(nudge_id="nd-1", reason="ttl"),
    ev.MergeRequestSubmitted(
        mr_id="mr-1",
        bead="demo-1",
        rig="demo",
        branch="polecat/ace/demo-1",
        target="main",
        head="0123abcd",
        priority=1,
        session="demo-1-2",
    ),
    ev.MergeRequestClaimed(mr_id="mr-1", attempt=2, holder="refinery-1-abc", lease_until=TS),
    ev.MergeRequestConflicted(mr_id="mr-1", target_commit="beef", conflict_command="conflict-mr-1-2", files=["a.txt"]),
    ev.MergeRequestFailed(mr_id="mr-1", gate="test", exit_code=1, tail="FAILED", escalated=True),
    ev.MergeRequestMerged(
        mr_id="mr-1", merged_commit="c0ffee", target_before="beef", gates_run=3, already=True, bug_bead_command="b"
    ),
    ev.MergeRequestRequeued(mr_id="mr-1", reason="conflict bead closed"),
    ev.MergeRequestRejected(mr_id="mr-1", reason="bogus"),
    ev.MergeQueuePaused(rig="demo", cause="push_refused", reason="main is checked out", mr_id="mr-1", detail="git"),
    ev.MergeQueueResumed(rig="demo"),
    ev.MergeQueueTargetFailed(rig="demo", gate="test", target="main", commit="beef", exit_code=1, tail="x", in_a_row=1),
    ev.GateJobRequested(
        job_id="g1",
        rig="demo",
        repo="/r.git",
        target="main",
        base="beef",
        commit="cafe",
        ref="refs/gt/gate/g1",
        stack=["mr-1", "mr-2"],
        key="k",
        gates=[GateCommand(gate="test", command="make test")],
        env=["CI"],
        timeout_s=600.0,
        pristine=True,
        requester="1234-abcdef",
    ),
    ev.GateJobStarted(job_id="g1", runner="runner-a", attempt=1),
    ev.GateJobHeartbeat(job_id="g1", runner="runner-a", attempt=1, gate="test"),
    ev.GateJobFinished(
        job_id="g1",
        runner="runner-a",
        attempt=1,
        passed=False,
        results=[GateResult(gate="test", exit_code=1, seconds=2.5, tail="boom", log_path="/l")],
        error="",
    ),
    ev.GateJobCancelled(job_id="g1", reason="its batch is done"),
    ev.ServiceUp(service="witness", instance="witness-4242-a1b2c3", pid=4242, host="box"),
    ev.ServiceDown(service="witness", instance="witness-4242-a1b2c3", reason="no heartbeat for 3.2 s", last_seen=TS),
    ev.ServiceStopped(service="witness", instance="witness-4242-a1b2c3"),
    ev.LeaseAcquired(lease="session-demo-ace-1", holder="demo-ace-1", token=1, ttl_s=60.0, expires_at=TS),
    ev.LeaseReleased(lease="session-demo-ace-1", holder="demo-ace-1", token=1),
    ev.LeaseExpired(lease="session-demo-ace-1", holder="demo-ace-1", token=1, last_renewed=TS),
    ev.GcSwept(cutoff=TS, ttl_s=604_800.0),
    ev.AutomationFired(
        automation="nightly",
        run_id="run-4k2p9a",
        gate="event",
        reason="bead.closed at seq 41",
        action="exec",
        cursor=41,
        holder="deacon-4242-a1b2c3",
        lease_until=TS,
        exec="./report.sh",
        timeout_s=300.0,
    ),
    ev.AutomationCompleted(automation="nightly", run_id="run-4k2p9a", result="report sent"),
    ev.AutomationFailed(automation="nightly", run_id="run-4k2p9a", error="exit 3: no disk", exit_code=3),
]


@pytest.mark.parametrize("payload", SAMPLES, ids=lambda p: p.TYPE)
def test_every_event_type_round_trips(payload: ev.Event) -> None:
    raw = ev.encode_event(payload, event_id="ev1", ts=TS, actor="mayor", causation_id="c1", correlation_id="k")
    env = ev.decode_envelope(raw)
    assert (env.id, env.type, env.v, env.ts, env.actor, env.causation_id) == ("ev1", payload.TYPE, 1, TS, "mayor", "c1")
    assert ev.REGISTRY.decode_payload(env) == payload


def test_every_registered_type_has_a_sample() -> None:
    assert {p.TYPE for p in SAMPLES} == set(ev.REGISTRY.classes())


def test_an_unset_update_field_is_not_stored_and_a_null_one_is() -> None:
    raw = ev.encode_event(ev.BeadUpdated(bead_id="hq-1", assignee=None), event_id="e", ts=TS, actor="a")
    data = msgspec.json.decode(ev.decode_envelope(raw).data)
    assert data == {"bead_id": "hq-1", "assignee": None}


def test_a_rig_event_from_before_gate_pristine_decodes_without_it() -> None:
    added = (
        b'{"id":"e","type":"rig.added","ts":"2026-05-01T12:00:00Z","actor":"a","data":{"rig":"demo","repo":"/r.git",'
        b'"prefix":"demo","agent_command":"gt-agent","gate_env":["CI_CACHE_URL"]}}'
    )
    payload = ev.REGISTRY.decode_payload(ev.decode_envelope(added))
    assert isinstance(payload, ev.RigAdded)
    assert (payload.gate_pristine, payload.gate_env) == (False, ["CI_CACHE_URL"])
    updated = (
        b'{"id":"e","type":"rig.updated","ts":"2026-05-01T12:00:00Z","actor":"a",'
        b'"data":{"rig":"demo","max_polecats":2}}'
    )
    changed = ev.REGISTRY.decode_payload(ev.decode_envelope(updated))
    assert isinstance(changed, ev.RigUpdated)
    assert changed.gate_pristine is msgspec.UNSET, "an update from before leaves the setting as it was"


def test_a_sling_from_before_the_agent_field_decodes_without_one_and_one_without_an_agent_stores_none() -> None:
    slung = (
        b'{"id":"e","type":"bead.slung","ts":"2026-05-01T12:00:00Z","actor":"a",'
        b'"data":{"bead_id":"hq-1","rig":"demo","forced":true}}'
    )
    payload = ev.REGISTRY.decode_payload(ev.decode_envelope(slung))
    assert isinstance(payload, ev.BeadSlung)
    assert (payload.agent, payload.forced) == (None, True), "the rig's agent, as before"
    raw = ev.encode_event(ev.BeadSlung(bead_id="hq-1", rig="demo"), event_id="e", ts=TS, actor="a")
    assert msgspec.json.decode(ev.decode_envelope(raw).data) == {"bead_id": "hq-1", "rig": "demo"}


def test_an_unknown_type_is_reported_not_crashed_on() -> None:
    raw = b'{"id":"e","type":"rig.teleported","ts":"2026-05-01T12:00:00Z","actor":"x","data":{"rig":"r"}}'
    env = ev.decode_envelope(raw)
    with pytest.raises(UnknownEventTypeError) as info:
        ev.REGISTRY.decode_payload(env)
    assert info.value.type == "rig.teleported"


def test_a_newer_version_of_a_known_type_is_unknown() -> None:
    raw = b'{"id":"e","type":"bead.closed","v":2,"ts":"2026-05-01T12:00:00Z","actor":"x","data":{"bead_id":"b"}}'
    with pytest.raises(UnknownEventTypeError):
        ev.REGISTRY.decode_payload(ev.decode_envelope(raw))


@pytest.mark.parametrize(
    "raw",
    [b"not json", b"[]", b'{"type":"bead.closed"}', b'{"id":"e","type":"t","ts":"yesterday","actor":"a","data":{}}'],
)
def test_a_broken_envelope_is_a_decode_error(raw: bytes) -> None:
    with pytest.raises(EventDecodeError):
        ev.decode_envelope(raw)


def test_a_payload_that_does_not_match_its_type_is_a_decode_error() -> None:
    raw = b'{"id":"e","type":"bead.claimed","ts":"2026-05-01T12:00:00Z","actor":"a","data":{"bead_id":3}}'
    with pytest.raises(EventDecodeError, match=r"bead\.claimed"):
        ev.REGISTRY.decode_payload(ev.decode_envelope(raw))


class _Renamed(ev.Event, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "test.renamed"
    VERSION: ClassVar[int] = 3
    name: str
    size: int = 0


def test_old_versions_are_upcast_step_by_step() -> None:
    registry = ev.EventRegistry([_Renamed])

    def v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
        return {"name": data["title"]}

    def v2_to_v3(data: dict[str, Any]) -> dict[str, Any]:
        return {**data, "size": len(data["name"])}

    registry.register_upcaster("test.renamed", 1, v1_to_v2)
    registry.register_upcaster("test.renamed", 2, v2_to_v3)
    raw = b'{"id":"e","type":"test.renamed","v":1,"ts":"2026-05-01T12:00:00Z","actor":"a","data":{"title":"abc"}}'
    assert registry.decode_payload(ev.decode_envelope(raw)) == _Renamed(name="abc", size=3)


def test_a_missing_upcaster_is_a_decode_error() -> None:
    registry = ev.EventRegistry([_Renamed])
    raw = b'{"id":"e","type":"test.renamed","v":2,"ts":"2026-05-01T12:00:00Z","actor":"a","data":{"name":"n"}}'
    with pytest.raises(EventDecodeError, match="no upcaster"):
        registry.decode_payload(ev.decode_envelope(raw))


def test_a_type_cannot_be_registered_twice() -> None:
    class Twin(ev.Event, frozen=True, kw_only=True):
        TYPE: ClassVar[str] = "bead.closed"

    with pytest.raises(ValueError, match="registered twice"):
        ev.EventRegistry([ev.BeadClosed, Twin])
