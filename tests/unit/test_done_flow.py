"""The `gt done` saga's steps (``shared/model/done_flow.py``), as `gt done` and the witness both build them."""

from __future__ import annotations

from pathlib import Path

from shared.core import ids
from shared.model import done_flow
from shared.model.commands import Fence, MergeRequestDone, SessionDoneIntentCmd, SessionFinish

HEAD = "0123456789abcdef0123456789abcdef01234567"


def _mr(head: str = HEAD, secret: str | None = None, fence: Fence | None = None) -> MergeRequestDone:
    return done_flow.merge_request(
        session="gt-4k2p9-1",
        bead="gt-4k2p9",
        rig="demo",
        branch="polecat/nux/gt-4k2p9",
        head=head,
        bundle=f"/town/rigs/demo/published/gt-4k2p9-1/{head}.bundle",
        fence=fence,
        secret=secret,
    )


def test_the_steps_are_the_session_commands_each_with_its_fixed_id() -> None:
    intent = done_flow.intent("gt-4k2p9-1")
    finish = done_flow.finish("gt-4k2p9-1")
    assert isinstance(intent, SessionDoneIntentCmd)
    assert isinstance(finish, SessionFinish)
    assert (intent.session, intent.cmd_id) == ("gt-4k2p9-1", "done-intent-gt-4k2p9-1")
    assert (finish.session, finish.cmd_id) == ("gt-4k2p9-1", "finish-gt-4k2p9-1")
    for cmd in (intent, finish, _mr()):
        cmd.validate()


def test_the_merge_request_id_names_the_session_and_the_published_commit() -> None:
    assert _mr().cmd_id == "mr-gt-4k2p9-1-0123456789ab"
    assert _mr().cmd_id == done_flow.merge_request_id("gt-4k2p9-1", HEAD)
    assert _mr().cmd_id == _mr().cmd_id, "the same commit submitted again (a rerun, the witness) is one command"
    assert _mr(head="f" * 40).cmd_id != _mr().cmd_id, "a new commit (a fix after a refusal) is another"


def test_the_agent_keys_every_id_with_its_password_and_the_witness_sends_them_plain() -> None:
    secret = "the-session-password"
    keyed = (done_flow.intent("s-1", secret=secret), _mr(secret=secret), done_flow.finish("s-1", secret=secret))
    plain = (done_flow.intent("s-1"), _mr(), done_flow.finish("s-1"))
    for mine, witness in zip(keyed, plain, strict=True):
        assert witness.cmd_id is not None
        assert mine.cmd_id == ids.keyed_id(witness.cmd_id, secret), "stable on a rerun"
        assert mine.cmd_id != witness.cmd_id, "never one another sender could guess and send first"
    assert done_flow.intent("s-1", secret="another").cmd_id != keyed[0].cmd_id


def test_the_witness_submits_with_the_sessions_hook_lease_as_its_fence() -> None:
    fence = Fence(lease="hook-gt-4k2p9", token=3)
    assert _mr(fence=fence).fence == fence
    assert _mr().fence is None, "the CLI's send adds the fence itself inside a session"
    assert _mr(fence=fence).session == "gt-4k2p9-1"


def test_the_branch_is_published_in_the_rigs_folder_of_the_session() -> None:
    rig_dir = Path("/town/rigs/demo.2")
    assert done_flow.published_dir(rig_dir, "gt-4k2p9-1") == rig_dir / "published" / "gt-4k2p9-1"
