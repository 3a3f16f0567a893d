"""Telling the refinery's push refusals apart, and the backoff and cap of the ones retried; and `gt rig add`'s
empty repository refused by the command's validation. Pure.

The stderr texts are git 2.39's own (``LC_ALL=C git push --quiet ...``), captured from real pushes: into a
non-bare repository with the branch checked out (plain, and with receive.denyCurrentBranch=updateInstead over
a dirty checkout or an untracked file in the way), a pre-receive hook exiting 1, a target that moved, a path
that is not a repository, a server not listening (http and ssh). The branch-protection texts are the ones
GitHub and GitLab print (their servers, not reproducible here).
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from services.refinery import plan
from services.refinery.plan import refusals
from services.refinery.settings import load
from shared.core.errors import CommandError
from shared.model.commands import parse_command
from shared.model.events import MergeRequestRequeued
from tests.unit.test_refinery_plan import Queue

CHECKED_OUT_PLAIN = """\
remote: error: refusing to update checked out branch: refs/heads/main        
remote: error: By default, updating the current branch in a non-bare repository        
remote: is denied, because it will make the index and work tree inconsistent        
remote: with what you pushed, and will require 'git reset --hard' to match        
remote: the work tree to HEAD.        
remote: 
remote: You can set the 'receive.denyCurrentBranch' configuration variable        
remote: to 'ignore' or 'warn' in the remote repository to allow pushing into        
remote: its current branch; however, this is not recommended unless you        
remote: arranged to update its work tree to match what you pushed in some        
remote: other way.        
remote: 
remote: To squelch this message and still keep the default behaviour, set        
remote: 'receive.denyCurrentBranch' configuration variable to 'refuse'.        
To /tmp/p0exp/plain
 ! [remote rejected] HEAD -> main (branch is currently checked out)
error: failed to push some refs to '/tmp/p0exp/plain'
"""  # noqa: W291 (git pads its remote lines)

CHECKED_OUT_DIRTY = """\
To /tmp/p0exp/plain
 ! [remote rejected] HEAD -> main (Working directory has unstaged changes)
error: failed to push some refs to '/tmp/p0exp/plain'
"""

CHECKED_OUT_UNTRACKED = """\
error: Untracked working tree file 'd' would be overwritten by merge.
To /tmp/p0exp/plain
 ! [remote rejected] HEAD -> main (Could not update working tree to new HEAD)
error: failed to push some refs to '/tmp/p0exp/plain'
"""

HOOK_DECLINED = """\
remote: policy: no pushes to main today        
To /tmp/p0exp/plain
 ! [remote rejected] HEAD -> main (pre-receive hook declined)
error: failed to push some refs to '/tmp/p0exp/plain'
"""  # noqa: W291

GITHUB_PROTECTED = """\
remote: error: GH006: Protected branch update failed for refs/heads/main.
remote: error: Changes must be made through a pull request.
To github.com:acme/calc.git
 ! [remote rejected] main -> main (protected branch hook declined)
error: failed to push some refs to 'github.com:acme/calc.git'
"""

GITLAB_PROTECTED = """\
remote: GitLab: You are not allowed to push code to protected branches on this project.
To gitlab.com:acme/calc.git
 ! [remote rejected] main -> main (pre-receive hook declined)
error: failed to push some refs to 'gitlab.com:acme/calc.git'
"""

SSH_PERMISSION = """\
git@github.com: Permission denied (publickey).
fatal: Could not read from remote repository.

Please make sure you have the correct access rights
and the repository exists.
"""

NON_FAST_FORWARD = """\
To /tmp/p0exp/plain
 ! [rejected]        HEAD -> main (non-fast-forward)
error: failed to push some refs to '/tmp/p0exp/plain'
hint: Updates were rejected because a pushed branch tip is behind its remote
hint: counterpart. Check out this branch and integrate the remote changes
hint: (e.g. 'git pull ...') before pushing again.
hint: See the 'Note about fast-forwards' in 'git push --help' for details.
"""

FETCH_FIRST = """\
To /tmp/p0exp/bare2.git
 ! [rejected]        HEAD -> main (fetch first)
error: failed to push some refs to '/tmp/p0exp/bare2.git'
hint: Updates were rejected because the remote contains work that you do
hint: not have locally. This is usually caused by another repository pushing
hint: to the same ref. You may want to first integrate the remote changes
hint: (e.g., 'git pull ...') before pushing again.
hint: See the 'Note about fast-forwards' in 'git push --help' for details.
"""

STALE_INFO = """\
To /tmp/p0exp/plain
 ! [rejected]        HEAD -> main (stale info)
error: failed to push some refs to '/tmp/p0exp/plain'
"""

NOT_A_REPOSITORY = """\
fatal: '/tmp/p0exp/nonexistent' does not appear to be a git repository
fatal: Could not read from remote repository.

Please make sure you have the correct access rights
and the repository exists.
"""

HTTP_DOWN = (
    "fatal: unable to access 'http://127.0.0.1:1/x.git/': Failed to connect to 127.0.0.1 port 1 after 0 ms: "
    "Couldn't connect to server\n"
)

SSH_DOWN = """\
ssh: connect to host 127.0.0.1 port 1: Connection refused
fatal: Could not read from remote repository.

Please make sure you have the correct access rights
and the repository exists.
"""


@pytest.mark.parametrize(
    ("exit_code", "stderr", "kind"),
    [
        (1, CHECKED_OUT_PLAIN, refusals.CHECKED_OUT),
        (1, CHECKED_OUT_DIRTY, refusals.CHECKED_OUT),
        (1, CHECKED_OUT_UNTRACKED, refusals.CHECKED_OUT),
        (1, HOOK_DECLINED, refusals.REFUSED),
        (1, GITHUB_PROTECTED, refusals.DENIED),
        (1, GITLAB_PROTECTED, refusals.DENIED),
        (128, SSH_PERMISSION, refusals.DENIED),
        (1, NON_FAST_FORWARD, refusals.MOVED),
        (1, FETCH_FIRST, refusals.MOVED),
        (1, STALE_INFO, refusals.MOVED),
        (128, NOT_A_REPOSITORY, refusals.UNREACHABLE),
        (128, HTTP_DOWN, refusals.UNREACHABLE),
        (128, SSH_DOWN, refusals.UNREACHABLE),
        (-1, "git push timed out after 120s", refusals.UNREACHABLE),
        (1, "error: something git never said before\n", refusals.REFUSED),
    ],
    ids=[
        "checked-out",
        "checked-out-dirty",
        "checked-out-untracked-in-the-way",
        "pre-receive-hook",
        "github-protected-branch",
        "gitlab-protected-branch",
        "ssh-permission",
        "non-fast-forward",
        "fetch-first",
        "stale-info",
        "not-a-repository",
        "http-down",
        "ssh-down",
        "timed-out",
        "unknown-is-not-retried",
    ],
)
def test_a_refusal_is_classed_by_its_cause(exit_code: int, stderr: str, kind: str) -> None:
    assert refusals.classify(exit_code, stderr) == kind


def test_only_a_moved_target_and_an_unreachable_repository_are_retried() -> None:
    assert {refusals.MOVED, refusals.UNREACHABLE} == refusals.RETRYABLE


def test_gits_message_is_kept_without_its_hints_blank_lines_and_padding() -> None:
    said = refusals.message(NON_FAST_FORWARD)
    assert said == (
        "To /tmp/p0exp/plain\n ! [rejected]        HEAD -> main (non-fast-forward)\n"
        "error: failed to push some refs to '/tmp/p0exp/plain'"
    )
    hook = refusals.message(HOOK_DECLINED)
    assert hook.splitlines()[0] == "remote: policy: no pushes to main today"
    assert "remote: \n" not in refusals.message(CHECKED_OUT_PLAIN)
    long = refusals.message("remote: x\n" * 1000)
    assert len(long) <= refusals.MESSAGE_CHARS + 10
    assert "[...]" in long


def test_the_checked_out_explanation_names_the_fixes() -> None:
    why = refusals.why(refusals.CHECKED_OUT, "main", "/home/me/src/calc")
    assert "commit or stash" in why
    assert "git clone --bare" in why


# ---- backoff and cap (the plan, with the test's clock) --------------------------------------------

POLICY = plan.Policy(push_retries=3, push_backoff_s=2.0, push_backoff_max_s=5.0)


def test_retries_back_off_exponentially_up_to_the_longest_wait_then_stop() -> None:
    q = Queue()
    now = q.clock
    waits = [plan.retry_at(n, now, POLICY) for n in range(5)]
    assert waits[:3] == [now + timedelta(seconds=s) for s in (2.0, 4.0, 5.0)]
    assert waits[3:] == [None, None], "after push_retries retries in a row: failed and escalated, never looped"


def test_a_requeued_merge_request_waits_out_its_backoff_and_the_refinery_is_woken_then() -> None:
    q = Queue()
    q.rig()
    mr = q.submit("de-a")
    q.claim(mr)
    not_before = q.clock + timedelta(seconds=4)
    q.add(MergeRequestRequeued(mr_id=mr, reason="the target moved during the merge", retries=2, not_before=not_before))
    assert (q.mr(mr).retries, q.mr(mr).not_before) == (2, not_before)
    planned = plan.next_batches(q.state, q.clock, POLICY, frozenset())
    assert planned.batches == []
    assert planned.wake_at == not_before, "level-triggered: the wait is in the log, the wake-up follows from it"
    q.tick(4)
    planned = plan.next_batches(q.state, q.clock, POLICY, frozenset())
    assert [[m.id for m in b] for b in planned.batches] == [[mr]]
    assert planned.wake_at is None


def test_a_retry_by_hand_starts_the_count_again() -> None:
    q = Queue()
    q.rig()
    mr = q.submit("de-a")
    q.claim(mr)
    q.add(MergeRequestRequeued(mr_id=mr, reason="moved", retries=3, not_before=q.clock + timedelta(seconds=9)))
    q.claim(mr)
    q.fail(mr)
    q.send("gt.cmd.mr.retry", {"id": mr})
    assert (q.mr(mr).status, q.mr(mr).retries, q.mr(mr).not_before) == ("queued", 0, None)
    assert [m.id for m in plan.next_per_rig(q.state, q.clock, POLICY, frozenset())] == [mr]


def test_the_push_retry_settings_are_read_from_the_environment() -> None:
    settings = load({"GT_MQ_PUSH_RETRIES": "2", "GT_MQ_PUSH_BACKOFF": "0.5", "GT_MQ_PUSH_BACKOFF_MAX": "30"})
    assert (settings.push_retries, settings.push_backoff_s, settings.push_backoff_max_s) == (2, 0.5, 30.0)
    assert load({}).push_retries == 8
    with pytest.raises(ValueError, match="GT_MQ_PUSH_RETRIES"):
        load({"GT_MQ_PUSH_RETRIES": "-1"})


# ---- gt rig add: an empty repository is never "here" ----------------------------------------------


@pytest.mark.parametrize("repo", ["", "   ", "\t"])
def test_a_rig_add_with_an_empty_or_blank_repository_is_invalid(repo: str) -> None:
    body = json.dumps({"name": "x", "repo": repo}).encode()
    with pytest.raises(CommandError) as info:
        parse_command("gt.cmd.rig.add", body)
    assert (info.value.code, info.value.message) == ("invalid", "`repo` must not be empty")
