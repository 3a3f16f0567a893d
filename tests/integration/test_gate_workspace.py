"""The rig's persistent gate workspace (issue 41): whatever a crash or a person left it in, the next merge finds it
repaired, or made again, and checked out at exactly the commit it gates; never merged from (nothing is: merges are
replayed in the clone, ``git_replay``). Ignored files survive from one merge to the next unless the rig is pristine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from services.refinery.effects import merger
from shared.host import git
from shared.host.gates import workspace
from tests.helpers import assert_eventually
from tests.witness_town import IDENTITY, PolecatTown


def commit(repo: Path, files: dict[str, str], message: str) -> str:
    for name, text in files.items():
        (repo / name).write_text(text)
    git.git("add", "-A", cwd=repo)
    git.git(*IDENTITY, "commit", "--quiet", "-m", message, cwd=repo)
    return git.git("rev-parse", "HEAD", cwd=repo).strip()


class Clone:
    def __init__(self, root: Path) -> None:
        src = root / "src"
        git.git("init", "--quiet", "-b", "main", str(src))
        (src / ".gitignore").write_text("build/\n")
        self.first = commit(src, {"README": "one\n"}, "first")
        self.second = commit(src, {"README": "two\n"}, "second")
        self.paths = merger.Paths(root / "rigs", "demo")
        git.git("clone", "--quiet", "--bare", "--", str(src), str(self.paths.bare))

    def check_out(self, commit: str, *, pristine: bool = False) -> Path:
        return workspace.check_out(self.paths.bare, self.paths.workspace, commit, pristine=pristine)


@pytest.fixture
def clone(tmp_path: Path) -> Clone:
    return Clone(tmp_path)


def head(path: Path) -> str:
    return git.git("rev-parse", "HEAD", cwd=path).strip()


def test_a_workspace_left_mid_rebase_with_a_lock_is_repaired_and_checked_out(clone: Clone) -> None:
    work = clone.check_out(clone.first)
    # A rebase that stops on a conflict (as a crash mid-rebase of an earlier version would leave it), and a lock.
    git.git("checkout", "--quiet", "--detach", clone.first, cwd=work)
    side = commit(work, {"README": "side\n"}, "side")
    git.git(*IDENTITY, "rebase", "--quiet", clone.second, cwd=work, check=False)
    git_dir = Path(git.git("rev-parse", "--absolute-git-dir", cwd=work).strip())
    assert (git_dir / "rebase-merge").exists() or (git_dir / "rebase-apply").exists(), "mid-rebase, as a crash left it"
    (git_dir / "index.lock").write_text("")
    assert side
    inode = work.stat().st_ino

    assert clone.check_out(clone.second) == work
    assert work.stat().st_ino == inode, "repaired in place (a workspace made again would have cost the whole tree)"
    assert head(work) == clone.second
    assert not (git_dir / "index.lock").exists()
    assert not (git_dir / "rebase-merge").exists()
    assert not (git_dir / "rebase-apply").exists()
    assert git.status_paths(work) == []
    assert (work / "README").read_text() == "two\n"


@pytest.mark.parametrize("damage", ["plain-directory", "unregistered", "git-file-elsewhere"])
def test_a_workspace_that_is_no_worktree_of_the_clone_is_made_again(clone: Clone, tmp_path: Path, damage: str) -> None:
    work = clone.check_out(clone.first)
    if damage == "plain-directory":
        git.force_remove(work)
        work.mkdir()
        (work / "README").write_text("not git's\n")
    elif damage == "unregistered":
        git.force_remove(clone.paths.bare / "worktrees")
    else:
        other = tmp_path / "other"
        git.git("init", "--quiet", str(other))
        (work / ".git").write_text(f"gitdir: {other / '.git'}\n")
    assert clone.check_out(clone.second) == work
    assert head(work) == clone.second
    assert (work / "README").read_text() == "two\n"
    assert str(work) in git.git("worktree", "list", "--porcelain", cwd=clone.paths.bare)


def test_ignored_files_survive_between_merges_unless_pristine_and_nothing_else_does(clone: Clone) -> None:
    work = clone.check_out(clone.first)
    (work / "build").mkdir()
    (work / "build" / "cache.o").write_text("warm\n")
    (work / "stray.txt").write_text("a gate's leftover, not ignored\n")
    (work / "README").write_text("changed by a gate\n")

    clone.check_out(clone.second)
    assert (work / "build" / "cache.o").read_text() == "warm\n", "a warm cache stays"
    assert not (work / "stray.txt").exists()
    assert (work / "README").read_text() == "two\n"

    clone.check_out(clone.first, pristine=True)
    assert not (work / "build").exists(), "a pristine rig keeps nothing"


async def test_a_merge_request_merges_through_a_workspace_a_crash_left_mid_rebase(pt: PolecatTown) -> None:
    await pt.add_rig(test_command="true")
    bead = await pt.new_bead("First", prefix="demo")
    first = await pt.submit(bead, "polecat/a/one", pt.push_branch("polecat/a/one", {"one.txt": "1\n"}))
    paths = merger.Paths(pt.config.gt_home / "rigs", "demo")
    assert pt.refinery is not None
    refinery = pt.refinery

    def merged(mr_id: str) -> bool:
        mr = refinery.projection.state.mrs.get(mr_id)
        return mr is not None and mr.status == "merged"

    await assert_eventually(lambda: merged(first), timeout=60)
    work = paths.workspace
    git.git("checkout", "--quiet", "--detach", "HEAD~1", cwd=work)
    commit(work, {"one.txt": "conflicting\n"}, "side")
    git.git(*IDENTITY, "rebase", "--quiet", "refs/remotes/origin/main", cwd=work, check=False)
    git_dir = Path(git.git("rev-parse", "--absolute-git-dir", cwd=work).strip())
    assert (git_dir / "rebase-merge").exists() or (git_dir / "rebase-apply").exists()
    (git_dir / "index.lock").write_text("")

    second_bead = await pt.new_bead("Second", prefix="demo")
    second = await pt.submit(second_bead, "polecat/b/two", pt.push_branch("polecat/b/two", {"two.txt": "2\n"}))
    await assert_eventually(lambda: merged(second), timeout=60)
    tree = git.git("ls-tree", "--name-only", "refs/heads/main", cwd=pt.origin).split()
    assert {"one.txt", "two.txt"} <= set(tree)
    assert git.git("show", "refs/heads/main:one.txt", cwd=pt.origin) == "1\n", "nothing of the broken rebase merged"
    assert not (git_dir / "index.lock").exists()
    assert not (git_dir / "rebase-merge").exists()
