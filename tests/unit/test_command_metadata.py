"""Each command class says who settles it (``OWNER``), which commands it is decided in order with
(``ordering_key``), the bead it works on as that bead's hook holder (``worked_bead``) and what places it in a rig
(``scope_ref``): the intake, the topology and the witness's scope read these instead of classifying commands."""

from __future__ import annotations

import pytest

from shared.bus.topology import COMMAND_OWNERS, command_filters, owner_of
from shared.model import commands as cmds
from shared.model.commands.base import ScopeRef
from shared.model.commands.rigs import mr_id_for

HEAD = "a" * 40
SERVICES = {"mayor", "witness", "refinery", "deacon"}


ALL = sorted(cmds.COMMANDS.values(), key=lambda c: c.SUBJECT)


@pytest.mark.parametrize("cls", ALL, ids=[c.SUBJECT for c in ALL])
def test_every_command_names_a_service_as_its_owner_and_its_aggregate_agrees(cls: type[cmds.Command]) -> None:
    assert cls.OWNER in SERVICES
    assert owner_of(cls.SUBJECT) == cls.OWNER
    assert COMMAND_OWNERS[cls.SUBJECT.split(".")[2]] == cls.OWNER


def test_the_consumers_read_what_they_read_before_the_owners_moved_onto_the_commands() -> None:
    assert command_filters("witness") == [
        "gt.cmd.agent.>",
        "gt.cmd.crew.>",
        "gt.cmd.nudge.>",
        "gt.cmd.rig.>",
        "gt.cmd.session.>",
    ]
    assert command_filters("refinery") == ["gt.cmd.mq.>", "gt.cmd.mr.>"]
    assert command_filters("deacon") == ["gt.cmd.automation.>", "gt.cmd.gc.>", "gt.cmd.lease.>"]
    assert command_filters("mayor") == ["gt.cmd.>"]


@pytest.mark.parametrize(
    ("cmd", "key"),
    [
        (cmds.BeadCreate(title="t"), None),
        (cmds.BeadCreate(title="t", new_id="hq-abc123"), "bead:hq-abc123"),
        (cmds.MailSend(to="mayor", body="b", new_id="hq-abc123"), "bead:hq-abc123"),
        (cmds.MailReply(id="hq-aaaaaa", body="b", new_id="hq-abc123"), "bead:hq-abc123"),
        (cmds.ConvoyCreate(title="c", new_id="cv-abc123"), "convoy:cv-abc123"),
        (cmds.EscalationRaise(severity="low", message="m", new_id="esc-abc123"), "escalation:esc-abc123"),
        (cmds.EscalationRaise(severity="low", message="m"), None),
        (cmds.BeadUpdate(id="hq-1", title="x"), "bead:hq-1"),
        (cmds.BeadClose(id="hq-1"), "bead:hq-1"),
        (cmds.BeadSling(id="hq-1", rig="demo"), "bead:hq-1"),
        (cmds.MailRead(id="hq-1"), "bead:hq-1"),
        (cmds.StepStart(bead="hq-1", step="s"), "bead:hq-1"),
        (cmds.StepDone(bead="hq-1", step="s"), "bead:hq-1"),
        (cmds.ConvoyAdd(id="cv-1", beads=["hq-1"]), "convoy:cv-1"),
        (cmds.EscalationAck(id="esc-1"), "escalation:esc-1"),
        (cmds.RigAdd(name="demo", repo="/r"), "rig:demo"),
        (cmds.RigUpdate(name="demo", max_polecats=2), "rig:demo"),
        (cmds.RigPark(name="demo"), "rig:demo"),
        (cmds.CrewAdd(rig="demo", name="ann"), "rig:demo"),
        (cmds.CrewHook(rig="demo", name="ann", bead="hq-1"), "rig:demo"),
        (cmds.SessionFinish(session="s-1"), "session:s-1"),
        (cmds.SessionStop(session="s-1"), "session:s-1"),
        (cmds.SessionRecoverHook(bead="hq-1", token=3), "hook:hq-1"),
        (cmds.NudgeSend(target="s-1", message="hi"), None),
        (cmds.MergeRequestRetry(id="mr-1"), "mr:mr-1"),
        (cmds.MergeRequestReject(id="mr-1"), "mr:mr-1"),
        (cmds.MergeQueueResume(rig="demo"), "mq:demo"),
        (cmds.LeaseAcquire(lease="l", holder="h", ttl_s=5), "lease:l"),
        (cmds.LeaseRelease(lease="l", holder="h", token=1), "lease:l"),
        (cmds.AutomationRun(name="nightly"), "automation:nightly"),
        (cmds.GcSweep(), "gc"),
    ],
    ids=repr,
)
def test_a_command_is_ordered_behind_the_others_on_its_aggregate(cmd: cmds.Command, key: str | None) -> None:
    assert cmd.ordering_key() == key


def test_a_merge_request_is_ordered_with_the_retries_and_rejections_of_the_same_request() -> None:
    submit = cmds.MergeRequestSubmit(bead="de-1", rig="demo", branch="b", head=HEAD)
    done = cmds.MergeRequestDone(bead="de-1", rig="demo", branch="b", head=HEAD, session="s-1")
    mr = mr_id_for("demo", "de-1", HEAD)
    assert submit.ordering_key() == done.ordering_key() == cmds.MergeRequestRetry(id=mr).ordering_key() == f"mr:{mr}"
    other_bead = cmds.MergeRequestSubmit(bead="de-2", rig="demo", branch="b", head=HEAD)
    assert other_bead.ordering_key() != submit.ordering_key()


def test_only_steps_claims_and_done_merge_requests_work_a_bead_as_its_hook_holder() -> None:
    assert cmds.StepStart(bead="hq-1", step="s").worked_bead() == "hq-1"
    assert cmds.StepDone(bead="hq-1", step="s").worked_bead() == "hq-1"
    assert cmds.BeadClaim(id="hq-1", assignee="a").worked_bead() == "hq-1"
    assert cmds.MergeRequestDone(bead="hq-1", rig="demo", branch="b", head=HEAD, session="s-1").worked_bead() == "hq-1"
    # A hand-submitted merge request, a close or a sling of the bead is no hook holder's work.
    assert cmds.MergeRequestSubmit(bead="hq-1", rig="demo", branch="b", head=HEAD).worked_bead() is None
    assert cmds.BeadClose(id="hq-1").worked_bead() is None
    assert cmds.BeadSling(id="hq-1", rig="demo").worked_bead() is None
    worked = {c.SUBJECT for c in cmds.COMMANDS.values() if "worked_bead" in vars(c)}
    assert worked == {"gt.cmd.bead.claim", "gt.cmd.mr.done"}  # the two steps inherit theirs


def test_witness_commands_name_what_places_them_in_a_rig() -> None:
    assert cmds.RigAdd(name="demo", repo="/r").scope_ref() == ScopeRef("rig", "demo")
    assert cmds.SessionFinish(session="s-1").scope_ref() == ScopeRef("session", "s-1")
    assert cmds.NudgeSend(target="demo/ace", message="hi").scope_ref() == ScopeRef("target", "demo/ace")
    assert cmds.SessionRecoverHook(bead="hq-1", token=1).scope_ref() == ScopeRef("bead", "hq-1")
    unplaced = [
        c.SUBJECT for c in cmds.COMMANDS.values() if c.OWNER == "witness" and c.scope_ref is cmds.Command.scope_ref
    ]
    # The town agents' commands name no rig: a witness of every rig settles them (``scope.route``).
    assert sorted(unplaced) == sorted(c.SUBJECT for c in cmds.TOWN_AGENT_COMMANDS)
