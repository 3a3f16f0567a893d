"""Every ref, branch or commit name reaches git as a name, never as an option: the adapters are called directly
(no validation in front of them, which refuses a leading ``-`` anyway) with names that are options of the git
command they run, against real repositories holding refs by exactly those names."""

from __future__ import annotations

from pathlib import Path

import pytest

from gt import agent
from services.refinery.effects import merger
from shared.host import git
from shared.host.gates import workspace
from shared.model.sessions import MergeFailure
from tests import records

# Each is an option of the command it is given to: a worktree or branch made, a rebase onto something else.
ORPHAN = "--orphan=pwned"
"""checkout / worktree add: would start a branch ``pwned`` with no history."""
ONTO = "--onto=main"
"""rebase: would rebase onto ``main`` instead."""
DASH = "-evil"


def commit(repo: Path, name: str, text: str) -> str:
    (repo / name).write_text(text)
    git.git("add", "--", name, cwd=repo)
    git.git("commit", "--quiet", "-m", f"add {name}", cwd=repo)
    return git.git("rev-parse", "HEAD", cwd=repo).strip()


class Repo:
    """main: base -> ahead; side: base -> sideways; refs named like options point at base and sideways."""

    def __init__(self, root: Path) -> None:
        self.src = root / "src"
        self.src.mkdir()
        git.git("init", "--quiet", "-b", "main", str(self.src))
        self.base = commit(self.src, "README", "base\n")
        git.git("checkout", "--quiet", "-b", "side", cwd=self.src)
        self.sideways = commit(self.src, "SIDE", "sideways\n")
        git.git("checkout", "--quiet", "main", cwd=self.src)
        self.ahead = commit(self.src, "AHEAD", "ahead\n")
        for name, target in ((ORPHAN, self.base), (ONTO, self.sideways), (DASH, self.sideways)):
            # update-ref takes a full ref name; `git tag` would refuse these names (validation, as ours does).
            git.git("update-ref", f"refs/tags/{name}", target, cwd=self.src)
        self.bare = root / "rigs" / "demo" / "refinery" / "repo.git"
        git.git("clone", "--quiet", "--bare", "--", str(self.src), str(self.bare))
        self.paths = merger.Paths(root / "rigs", "demo")

    def branches(self, repo: Path) -> set[str]:
        return set(git.git("for-each-ref", "--format=%(refname:short)", "refs/heads/", cwd=repo).split())


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    return Repo(tmp_path)


def head(work: Path) -> str:
    return git.git("rev-parse", "HEAD", cwd=work).strip()


def test_the_refinery_reads_a_ref_named_like_an_option_as_a_name(repo: Repo) -> None:
    assert merger._rev(repo.paths, ORPHAN) == repo.base
    assert merger._rev(repo.paths, DASH) == repo.sideways
    assert merger._rev(repo.paths, "--all") == "", "no such ref: nothing, not every ref"


def test_the_refinery_checks_its_gate_workspace_out_at_a_ref_named_like_an_option(repo: Repo) -> None:
    before = repo.branches(repo.bare)
    work = workspace.check_out(repo.bare, repo.paths.workspace, ORPHAN, pristine=False)
    assert head(work) == repo.base
    workspace.check_out(repo.bare, work, repo.ahead, pristine=False)
    workspace.check_out(repo.bare, work, ORPHAN, pristine=True)
    assert head(work) == repo.base
    assert repo.branches(repo.bare) == before, "no branch was made by an option"
    with pytest.raises(git.GitError, match="names no commit"):
        workspace.check_out(repo.bare, work, "--detach", pristine=False)


def test_the_refinery_rebases_onto_a_ref_named_like_an_option(repo: Repo) -> None:
    tip, conflicts = merger._rebase(repo.paths, repo.ahead, ONTO)
    assert conflicts == []
    assert tip is not None
    # Onto the ref (side), not onto main as the option would have it.
    assert git.git("rev-parse", f"{tip}^", cwd=repo.bare).strip() == repo.sideways
    assert git.git("rev-parse", f"{tip}:AHEAD", cwd=repo.bare).strip(), "the change itself is on it"


def test_worktrees_and_their_state_take_a_base_named_like_an_option(repo: Repo, tmp_path: Path) -> None:
    assert git._ref_exists(repo.bare, DASH)
    assert git.resolve_commit(repo.bare, ORPHAN) == repo.base
    path = tmp_path / "polecats" / "ace"
    assert git.ensure_worktree(repo.bare, path, "polecat/ace/hq-1", DASH)
    assert head(path) == repo.sideways
    commit(path, "WORK", "work\n")
    state = git.worktree_state(path, DASH)  # no origin/<branch>, no origin/<base>: counted against the base itself
    assert state.unpushed == 1


def test_the_reference_agent_rebases_onto_a_target_named_like_an_option(
    repo: Repo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    origin = tmp_path / "origin.git"
    git.git("clone", "--quiet", "--bare", "--", str(repo.src), str(origin))
    worktree = tmp_path / "clone"
    git.git("clone", "--quiet", "--", str(origin), str(worktree))
    git.git("checkout", "--quiet", "-b", "polecat/ace/hq-1", repo.ahead, cwd=worktree)
    git.git("push", "--quiet", "--", "origin", "polecat/ace/hq-1", cwd=worktree)
    data = records.prime(worktree=str(worktree), branch="polecat/ace/hq-1")
    failure = MergeFailure(mr="mr-1", gate="conflict", exit_code=0, target_commit=ONTO, files=["AHEAD"])
    agent.resolve_conflict(data, failure)
    # Rebased in its workspace (its `gt done` publishes it; nothing is pushed).
    rebased = git.git("rev-parse", "refs/heads/polecat/ace/hq-1", cwd=worktree).strip()
    assert git.git("rev-parse", f"{rebased}^", cwd=worktree).strip() == repo.sideways
    assert "resolved" in capsys.readouterr().out


@pytest.mark.parametrize("new_branch", [False, True])
def test_a_worktree_whose_directory_was_removed_by_hand_is_added_again(
    repo: Repo, tmp_path: Path, new_branch: bool
) -> None:
    """Its registration blocks the add (git refuses the path, after making a new branch); it is pruned and the
    worktree added on the branch, whether the branch is new or already there."""
    path = tmp_path / "polecats" / "ace"
    assert git.ensure_worktree(repo.bare, path, "polecat/ace/hq-1", "main")
    git.force_remove(path)
    branch = "polecat/ace/hq-2" if new_branch else "polecat/ace/hq-1"
    assert git.ensure_worktree(repo.bare, path, branch, "main")
    assert git.git("rev-parse", "--abbrev-ref", "HEAD", cwd=path).strip() == branch
    assert head(path) == repo.ahead
    assert not git.git("config", "--get-regexp", r"^branch\.", cwd=repo.bare, check=False).strip(), (
        "a polecat's branch tracks nothing (no config written per session)"
    )
