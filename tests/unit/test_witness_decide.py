"""Pure decisions of the witness (rigs, the agent side of sessions, nudges) and the refinery (merge request
intake), and the reference agent's fault syntax."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from gt.agent_start import Fault, active, parse_faults
from services.refinery import decide as refinery_decide
from services.refinery.projection import new_projection as new_refinery_projection
from services.witness import decide as witness_decide
from services.witness.projection import new_projection as new_witness_projection
from shared.model.events import (
    BeadCreated,
    BeadSlung,
    RigAdded,
    SessionEnded,
    SessionRequested,
    SessionStarted,
)
from tests.memory_log import Deciding

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
HEAD = "0123456789abcdef0123456789abcdef01234567"


def witness() -> Deciding:
    return Deciding(new_witness_projection(), witness_decide.decide, clock=T0)


def with_session(fed: Deciding) -> Deciding:
    fed.add(RigAdded(rig="demo", repo="/repos/demo.git", prefix="demo", agent_command="gt-agent"))
    fed.add(BeadCreated(bead_id="demo-1", title="a bead"), BeadSlung(bead_id="demo-1", rig="demo"))
    fed.add(
        SessionRequested(
            session_id="demo-1-1",
            rig="demo",
            polecat="ace",
            bead="demo-1",
            worktree="/w/ace",
            branch="polecat/ace/demo-1",
            tmux_name="gt-demo-ace",
            attempt=1,
        ),
        SessionStarted(session_id="demo-1-1", pane_pid=10, pid_started=1.0),
    )
    return fed


# ---- rig.add -----------------------------------------------------------------------------------


def test_rig_add_records_the_rig_once_and_is_idempotent_for_the_same_configuration() -> None:
    fed = witness()
    first = fed.send("gt.cmd.rig.add", name="demo", repo="/repos/demo.git", facts=witness_decide.RepoFacts(None))
    assert (first["changed"], first["prefix"]) == (True, "demo")
    again = fed.send("gt.cmd.rig.add", name="demo", repo="/repos/demo.git")
    assert again["changed"] is False
    assert len(fed.log.messages) == 1


def test_rig_add_rejects_a_missing_repository_with_what_prepare_found() -> None:
    fed = witness()
    problem = "repository /nowhere cannot be read: fatal: '/nowhere' does not appear to be a git repository"
    error = fed.reject("gt.cmd.rig.add", facts=witness_decide.RepoFacts(problem), name="demo", repo="/nowhere")
    assert (error.code, error.message) == ("not_found", problem)
    assert fed.log.messages == []


@pytest.mark.parametrize(
    ("body", "code", "fragment"),
    [
        ({"name": "demo", "repo": "relative/path"}, "invalid", "absolute path or a URL"),
        ({"name": "Demo!", "repo": "/r"}, "invalid", "name"),
        ({"name": "demo", "repo": "/r", "max_polecats": 0}, "invalid", "max_polecats"),
        ({"name": "demo", "repo": "/r", "max_respawns": 101}, "invalid", "max_respawns"),
        ({"name": "demo", "repo": "/r", "stall_after_s": 0}, "invalid", "stall_after_s"),
        ({"name": "demo", "repo": "/r", "base_branch": "a..b"}, "invalid", "base_branch"),
        ({"name": "demo", "repo": "/r", "agent_command": "  "}, "invalid", "agent_command"),
        ({"name": "demo", "repo": "/r", "colour": "red"}, "invalid", "colour"),
    ],
)
def test_rig_add_rejects_bad_input_with_a_clear_error(body: dict[str, Any], code: str, fragment: str) -> None:
    fed = witness()
    error = fed.reject("gt.cmd.rig.add", **body)
    assert error.code == code
    assert fragment in error.message


def test_rig_add_refuses_a_changed_configuration_and_a_taken_prefix() -> None:
    fed = witness()
    fed.send("gt.cmd.rig.add", name="demo", repo="/repos/demo.git")
    changed = fed.reject("gt.cmd.rig.add", name="demo", repo="/repos/other.git")
    assert changed.code == "conflict"
    assert "different configuration" in changed.message
    clash = fed.reject("gt.cmd.rig.add", name="demo2", repo="/repos/x.git", prefix="demo")
    assert clash.code == "conflict"
    assert "prefix 'demo'" in clash.message


def test_rig_update_records_only_what_changes() -> None:
    fed = witness()
    fed.send("gt.cmd.rig.add", name="demo", repo="/repos/demo.git", test_command="make test")
    result = fed.send("gt.cmd.rig.update", name="demo", agent_command="claude", test_command="make test")
    assert (result["changed"], result["fields"]) == (True, ["agent_command"])
    _seq, subject, data = fed.log.messages[-1]
    assert subject == "gt.evt.rig.demo"
    envelope = msgspec.json.decode(data)
    assert envelope["type"] == "rig.updated"
    assert sorted(envelope["data"]) == ["agent_command", "rig"], "only the changed field is stored"
    again = fed.send("gt.cmd.rig.update", name="demo", agent_command="claude")
    assert (again["changed"], len(fed.log.messages)) == (False, 2)
    assert fed.projection.state.rigs["demo"].agent_command == "claude"


def test_rig_update_changes_the_git_identity_of_new_sessions() -> None:
    fed = witness()
    fed.send("gt.cmd.rig.add", name="demo", repo="/repos/demo.git")
    result = fed.send("gt.cmd.rig.update", name="demo", git_name="Bot {polecat}", git_email="bots+{polecat}@x.org")
    assert (result["changed"], sorted(result["fields"])) == (True, ["git_email", "git_name"])
    rig = fed.projection.state.rigs["demo"]
    assert (rig.git_name, rig.git_email) == ("Bot {polecat}", "bots+{polecat}@x.org")
    fed.send("gt.cmd.rig.update", name="demo", git_name="")
    assert fed.projection.state.rigs["demo"].git_name == "", "empty: back to the default {rig}/{polecat}"


def test_rig_add_with_gate_pristine_records_it_and_without_it_the_gate_workspace_persists() -> None:
    fed = witness()
    fed.send("gt.cmd.rig.add", name="demo", repo="/repos/demo.git", gate_pristine=True)
    fed.send("gt.cmd.rig.add", name="kept", repo="/repos/kept.git")
    added = msgspec.json.decode(fed.log.messages[0][2])
    assert (added["type"], added["data"]["gate_pristine"]) == ("rig.added", True)
    rigs = fed.projection.state.rigs
    assert (rigs["demo"].gate_pristine, rigs["kept"].gate_pristine) == (True, False)
    assert fed.send("gt.cmd.rig.add", name="demo", repo="/repos/demo.git", gate_pristine=True)["changed"] is False
    changed = fed.reject("gt.cmd.rig.add", name="demo", repo="/repos/demo.git")
    assert (changed.code, "different configuration" in changed.message) == ("conflict", True)


def test_rig_update_turns_gate_pristine_on_and_off() -> None:
    fed = witness()
    fed.send("gt.cmd.rig.add", name="demo", repo="/repos/demo.git")
    on = fed.send("gt.cmd.rig.update", name="demo", gate_pristine=True)
    assert (on["changed"], on["fields"], on["gate_pristine"]) == (True, ["gate_pristine"], True)
    envelope = msgspec.json.decode(fed.log.messages[-1][2])
    assert (envelope["type"], envelope["data"]) == ("rig.updated", {"rig": "demo", "gate_pristine": True})
    assert fed.projection.state.rigs["demo"].gate_pristine is True
    again = fed.send("gt.cmd.rig.update", name="demo", gate_pristine=True)
    assert (again["changed"], len(fed.log.messages)) == (False, 2)
    off = fed.send("gt.cmd.rig.update", name="demo", gate_pristine=False)
    assert (off["changed"], off["fields"], off["gate_pristine"]) == (True, ["gate_pristine"], False)
    assert fed.projection.state.rigs["demo"].gate_pristine is False
    kept = fed.send("gt.cmd.rig.update", name="demo", max_polecats=2)
    assert "gate_pristine" not in kept["fields"]
    assert fed.projection.state.rigs["demo"].gate_pristine is False, "an update without it leaves it"


@pytest.mark.parametrize(
    ("body", "code", "fragment"),
    [
        ({"name": "nosuch", "agent_command": "x"}, "not_found", "no rig 'nosuch'"),
        ({"name": "demo"}, "invalid", "at least one setting"),
        ({"name": "demo", "max_polecats": 0}, "invalid", "max_polecats"),
        ({"name": "demo", "agent_command": " "}, "invalid", "agent_command"),
        ({"name": "demo", "repo": "/elsewhere"}, "invalid", "repo"),
        ({"name": "demo", "git_email": "<{polecat}@x>"}, "invalid", "git_email"),
        ({"name": "demo", "gate_pristine": "yes"}, "invalid", "gate_pristine"),
    ],
)
def test_rig_update_rejects_bad_input_with_a_clear_error(body: dict[str, Any], code: str, fragment: str) -> None:
    fed = witness()
    fed.send("gt.cmd.rig.add", name="demo", repo="/repos/demo.git")
    error = fed.reject("gt.cmd.rig.update", **body)
    assert error.code == code
    assert fragment in error.message


def test_rig_remove_is_refused_while_beads_are_hooked_unless_forced() -> None:
    fed = with_session(witness())
    refused = fed.reject("gt.cmd.rig.remove", name="demo")
    assert refused.code == "conflict"
    assert "rig demo has work hooked: demo-1" in refused.message
    removed = fed.send("gt.cmd.rig.remove", name="demo", force=True)
    assert (removed["changed"], removed["hooked"]) == (True, ["demo-1"])
    rig = fed.projection.state.rigs["demo"]
    assert (rig.parked, rig.removed) == (True, True)
    assert fed.send("gt.cmd.rig.remove", name="demo")["changed"] is False
    assert fed.reject("gt.cmd.rig.unpark", name="demo").code == "not_found"
    assert fed.reject("gt.cmd.rig.add", name="demo", repo="/repos/demo.git").code == "conflict"


def test_park_and_unpark_are_idempotent_and_a_parked_rigs_hook_is_not_stale() -> None:
    fed = with_session(witness())
    assert fed.send("gt.cmd.rig.park", name="demo", reason="CI down")["changed"] is True
    assert fed.send("gt.cmd.rig.park", name="demo")["changed"] is False
    fed.add(SessionEnded(session_id="demo-1-1", reason="dead"))
    answer = fed.send("gt.cmd.session.recover_hook", bead="demo-1", token=1)
    assert answer["status"] == "not_stale"
    assert "parked" in answer["why"]
    assert fed.send("gt.cmd.rig.unpark", name="demo")["changed"] is True
    assert fed.send("gt.cmd.rig.unpark", name="demo")["changed"] is False


# ---- the agent's side of a session -------------------------------------------------------------


def test_done_needs_its_intent_first_and_both_are_idempotent() -> None:
    fed = with_session(witness())
    refused = fed.reject("gt.cmd.session.finish", session="demo-1-1")
    assert refused.code == "invalid"
    assert "no done-intent" in refused.message
    assert fed.send("gt.cmd.session.done_intent", session="demo-1-1")["changed"] is True
    assert fed.send("gt.cmd.session.done_intent", session="demo-1-1")["changed"] is False
    assert fed.send("gt.cmd.session.finish", session="demo-1-1")["changed"] is True
    again = fed.send("gt.cmd.session.finish", session="demo-1-1")
    assert (again["changed"], again["status"]) == (False, "ended")
    handoff = fed.reject("gt.cmd.session.handoff", session="demo-1-1")
    assert handoff.code == "conflict"


def test_a_finishing_session_cannot_hand_off_and_an_unknown_session_is_not_found() -> None:
    fed = with_session(witness())
    fed.send("gt.cmd.session.done_intent", session="demo-1-1")
    assert fed.reject("gt.cmd.session.handoff", session="demo-1-1").code == "conflict"
    missing = fed.reject("gt.cmd.session.done_intent", session="demo-9-9")
    assert missing.code == "not_found"
    assert "gt session list" in missing.message


def test_a_stop_warrants_the_session_once_and_an_ended_one_is_left_alone() -> None:
    fed = with_session(witness())
    stopping = fed.send("gt.cmd.session.stop", session="demo-1-1")
    assert (stopping["status"], stopping["changed"]) == ("stopping", True)
    session = fed.projection.state.sessions["demo-1-1"]
    assert session.warrant_reason == "stopped"
    assert fed.send("gt.cmd.session.stop", session="demo-1-1")["changed"] is False
    assert fed.reject("gt.cmd.session.stop", session="demo-9-9").code == "not_found"


def test_a_nudge_result_says_whether_its_target_runs_now() -> None:
    fed = with_session(witness())
    assert fed.send("gt.cmd.nudge.send", target="demo/ace", message="hello")["live"] is True


# ---- nudges ------------------------------------------------------------------------------------


def test_a_nudge_names_a_session_or_a_known_polecat() -> None:
    fed = with_session(witness())
    to_session = fed.send("gt.cmd.nudge.send", target="demo-1-1", message="check the tests")
    assert (to_session["session"], to_session["polecat"]) == ("demo-1-1", "ace")
    assert to_session["expires_at"] == (T0 + timedelta(seconds=1800)).isoformat()
    to_polecat = fed.send("gt.cmd.nudge.send", target="demo/ace", message="hello", ttl_s=60)
    assert (to_polecat["session"], to_polecat["rig"]) == (None, "demo")


@pytest.mark.parametrize(
    ("target", "fragment"),
    [
        ("nosuch-1", "no session or polecat 'nosuch-1'"),
        ("ghost/ace", "no rig 'ghost'"),
        ("demo/zed", "rig demo has no polecat 'zed' (its polecats: ace)"),
    ],
)
def test_a_nudge_to_an_unknown_target_is_rejected_and_nothing_is_queued(target: str, fragment: str) -> None:
    fed = with_session(witness())
    before = len(fed.log.messages)
    error = fed.reject("gt.cmd.nudge.send", target=target, message="hi")
    assert error.code == "not_found"
    assert fragment in error.message
    assert len(fed.log.messages) == before


def test_a_nudge_message_must_be_one_line() -> None:
    error = with_session(witness()).reject("gt.cmd.nudge.send", target="demo/ace", message="two\nlines")
    assert error.code == "invalid"


# ---- merge request intake (refinery) -----------------------------------------------------------


def refinery() -> Deciding:
    fed = Deciding(new_refinery_projection(), refinery_decide.decide, clock=T0)
    fed.add(RigAdded(rig="demo", repo="/repos/demo.git", prefix="demo", agent_command="gt-agent"))
    fed.add(BeadCreated(bead_id="demo-1", title="a bead"), BeadSlung(bead_id="demo-1", rig="demo"))
    return fed


def test_a_merge_request_is_queued_once_per_head_commit() -> None:
    fed = refinery()
    body = {"bead": "demo-1", "rig": "demo", "branch": "polecat/ace/demo-1", "head": HEAD}
    first = fed.send("gt.cmd.mr.submit", **body)
    assert first["id"] == refinery_decide.mr_id_for("demo", "demo-1", HEAD)
    assert first["changed"] is True
    assert fed.send("gt.cmd.mr.submit", **body)["changed"] is False
    assert len(fed.log.messages) == 4
    mr = fed.projection.state.mrs[first["id"]]
    assert (mr.target, mr.branch) == ("main", "polecat/ace/demo-1")


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"bead": "demo-9", "rig": "demo", "branch": "b", "head": HEAD}, "not_found"),
        ({"bead": "demo-1", "rig": "ghost", "branch": "b", "head": HEAD}, "not_found"),
        ({"bead": "demo-1", "rig": "demo", "branch": "b", "head": "not-a-commit"}, "invalid"),
        ({"bead": "demo-1", "rig": "demo", "branch": " ", "head": HEAD}, "invalid"),
    ],
)
def test_a_merge_request_for_something_unknown_is_rejected(body: dict[str, Any], code: str) -> None:
    fed = refinery()
    assert fed.reject("gt.cmd.mr.submit", **body).code == code
    assert len(fed.log.messages) == 3


def test_a_merge_request_for_a_bead_slung_elsewhere_is_rejected() -> None:
    fed = refinery()
    fed.add(RigAdded(rig="other", repo="/repos/o.git", prefix="other", agent_command="gt-agent"))
    error = fed.reject("gt.cmd.mr.submit", bead="demo-1", rig="other", branch="b", head=HEAD)
    assert error.code == "invalid"
    assert "slung to rig demo" in error.message


# ---- the reference agent's faults --------------------------------------------------------------


def test_faults_parse_with_steps_and_attempt_ranges() -> None:
    faults = parse_faults("crash-at-step=3@1, hang@2-3,fail-tests")
    assert faults == [
        Fault(kind="crash-at-step", step=3, first_attempt=1, last_attempt=1),
        Fault(kind="hang", first_attempt=2, last_attempt=3),
        Fault(kind="fail-tests"),
    ]
    assert active(faults, 1, "crash-at-step", 3)
    assert not active(faults, 2, "crash-at-step", 3)
    assert not active(faults, 1, "crash-at-step", 2)
    assert [active(faults, n, "hang") for n in (1, 2, 3, 4)] == [False, True, True, False]
    assert active(faults, 99, "fail-tests")
    assert parse_faults("") == []
    assert parse_faults("hang=2@1-4") == [Fault(kind="hang", step=2, first_attempt=1, last_attempt=4)]
    assert Fault(kind="hang") != Fault(kind="hang", step=1)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("explode", "cannot read 'explode'"),
        ("crash-at-step", "needs a step"),
        *[
            (text, "cannot read")
            for text in ("hang@x", "hang=", "hang@", "hang@1-", "hang@1-2-3", "hang=2=3", "hang@²")
        ],
    ],
)
def test_unreadable_faults_are_rejected_by_name(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        parse_faults(text)
