"""Who a session is: the actor its commands carry and the git identity it commits with. Pure."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec
import pytest

from gt.cli.identity import default_actor, session_actor, session_origin
from services.witness.effects.agent_env import polecat_git_env
from services.witness.state import Rig
from shared.bus.commands import subject_of
from shared.core import subjects
from shared.core.errors import CommandError
from shared.model.commands import Command, MailSend, RigAdd, StepDone

SESSION = {"GT_SESSION": "gt-abc-2", "GT_RIG": "demo", "GT_POLECAT": "ace", "GT_BEAD": "gt-abc"}


def test_a_session_acts_as_its_polecat_and_anything_else_as_the_operator() -> None:
    assert session_actor(SESSION) == "polecat:demo/ace"
    assert default_actor(None, SESSION) == "polecat:demo/ace"
    assert default_actor("operator:ann", SESSION) == "operator:ann", "an explicit --actor wins"
    assert session_actor({}) is None, "outside a session: the service records `operator`"
    assert session_actor({"GT_RIG": "demo"}) is None
    assert default_actor(None, {}) is None


def command_subject(cmd: Command, env: dict[str, str]) -> str:
    """Where the CLI sends ``cmd`` from a process with environment ``env`` (``gt.cli.client.send``)."""
    return subject_of(cmd, session_origin(env))


def test_inside_a_session_commands_go_to_the_sessions_own_subject() -> None:
    done = StepDone(bead="gt-abc", step="implement")
    assert command_subject(done, SESSION) == "gt.cmd.step.done.demo.ace.gt-abc-2"
    assert command_subject(done, {}) == "gt.cmd.step.done", "an operator's go to the plain subject"
    assert command_subject(done, {"GT_RIG": "demo", "GT_POLECAT": "ace"}) == "gt.cmd.step.done"
    sent = command_subject(MailSend(to="mayor", body="hello"), SESSION)
    assert subjects.split_origin(sent) == (
        "gt.cmd.mail.send",
        subjects.SessionOrigin("demo", "ace", "gt-abc-2"),
    )


def rig(git_name: str = "", git_email: str = "") -> Rig:
    added = datetime.now(UTC)
    return Rig(
        name="demo",
        repo="/r.git",
        prefix="demo",
        agent_command="gt-agent",
        added_at=added,
        git_name=git_name,
        git_email=git_email,
    )


def test_a_polecat_commits_as_rig_slash_polecat_unless_its_rig_says_otherwise() -> None:
    assert polecat_git_env(rig(), "ace") == {
        "GIT_AUTHOR_NAME": "demo/ace",
        "GIT_AUTHOR_EMAIL": "ace.demo@gastown.invalid",
        "GIT_COMMITTER_NAME": "demo/ace",
        "GIT_COMMITTER_EMAIL": "ace.demo@gastown.invalid",
    }
    custom = polecat_git_env(rig(git_name="{polecat} ({rig} bot)", git_email="bots@example.com"), "bob")
    assert (custom["GIT_AUTHOR_NAME"], custom["GIT_AUTHOR_EMAIL"]) == ("bob (demo bot)", "bots@example.com")
    assert (custom["GIT_COMMITTER_NAME"], custom["GIT_COMMITTER_EMAIL"]) == ("bob (demo bot)", "bots@example.com")


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("git_name", "Bot {name}", "only {rig} and {polecat}"),
        ("git_email", "{user}@example.com", "only {rig} and {polecat}"),
        ("git_email", "<bot@example.com>", "< or >"),
        ("git_name", "one\ntwo", "one line"),
        ("git_name", "x" * 201, "git_name"),
    ],
)
def test_a_git_identity_template_git_cannot_use_is_refused(field: str, value: str, says: str) -> None:
    cmd = msgspec.structs.replace(RigAdd(name="demo", repo="/r.git"), **{field: value})
    with pytest.raises(CommandError) as caught:
        cmd.validate()
    assert caught.value.code == "invalid"
    assert says in str(caught.value)


def test_the_default_git_identity_is_an_empty_template() -> None:
    RigAdd(name="demo", repo="/r.git").validate()
    RigAdd(name="demo", repo="/r.git", git_name="{rig}/{polecat}", git_email="{polecat}@{rig}.example").validate()
