"""The rig's persistent gate workspace (issue 41): whatever a crash or a person left it in, the next merge finds it
repaired, or made again, and checked out at exactly the commit it gates; never merged from (nothing is: merges are
replayed in the clone, ``git_replay``). Ignored files survive from one merge to the next unless the rig is pristine.

A workspace settled after its gates (``workspace.settle``, in the background) is moved by the change alone: after
such a move it must equal a fresh checkout of the commit (index, files, modes, links, nothing untracked), and
whatever the move cannot do exactly, or a workspace nobody settled, takes the full pass.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from services.refinery.effects import merger
from shared.host import git, tree_moves
from shared.host.gates import execution, workspace
from shared.model.events.gate_jobs import GateCommand
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
        self.root = root
        self.src = src = root / "src"
        git.git("init", "--quiet", "-b", "main", str(src))
        (src / ".gitignore").write_text("build/\n")
        self.first = commit(src, {"README": "one\n"}, "first")
        self.second = commit(src, {"README": "two\n"}, "second")
        self.paths = merger.Paths(root / "rigs", "demo")
        git.git("clone", "--quiet", "--bare", "--", str(src), str(self.paths.bare))

    def check_out(self, commit: str, *, pristine: bool = False) -> Path:
        return workspace.check_out(self.paths.bare, self.paths.workspace, commit, pristine=pristine)

    def change(self, change: Callable[[Path], None], message: str) -> str:
        """A commit on the source's main made by ``change`` (run in its work tree), fetched into the clone."""
        change(self.src)
        git.git("add", "-A", cwd=self.src)
        git.git(*IDENTITY, "commit", "--quiet", "--allow-empty", "-m", message, cwd=self.src)
        git.git("fetch", "--quiet", str(self.src), "+refs/heads/*:refs/heads/*", cwd=self.paths.bare)
        return git.git("rev-parse", "HEAD", cwd=self.src).strip()


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


# The settled fast move (issue 41): the workspace put back after the gates in the background, then moved by the
# change alone.

LAYOUT = {
    "dir/inner": "inside a directory\n",
    "only/one": "a directory's last file\n",
    "swap": "a file that becomes a directory\n",
    "tree/leaf": "a directory that becomes a file\n",
    "tool.sh": "#!/bin/sh\necho tool\n",
    "pkg/a.py": "A = 1\n",
    "pkg/b.py": "B = 2\n",
}


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def remove(root: Path, *names: str) -> None:
    for name in names:
        (root / name).unlink()


def add_files(root: Path) -> None:
    write(root, {"new/deep/file.txt": "new\n", "we*ird[1].txt": "glob characters\n", ":(glob)odd": "magic\n"})
    write(root, {"-dash": "an option's look\n", "ünï.txt": "not ASCII\n", "pkg/c.py": "C = 3\n"})


def modify_files(root: Path) -> None:
    write(root, {"pkg/a.py": "A = 10\n", "README": "changed\n"})


def delete_files(root: Path) -> None:
    remove(root, "pkg/b.py", "tool.sh")


def make_executable(root: Path) -> None:
    (root / "tool.sh").chmod(0o755)


def add_symlink(root: Path) -> None:
    (root / "link-to-pkg").symlink_to("pkg")
    (root / "dir" / "link-to-a").symlink_to("../pkg/a.py")


def delete_last_file_of_a_directory(root: Path) -> None:
    remove(root, "only/one")


def file_becomes_directory(root: Path) -> None:
    remove(root, "swap")
    write(root, {"swap/inside": "now a directory\n"})


def directory_becomes_file(root: Path) -> None:
    remove(root, "tree/leaf")
    (root / "tree").rmdir()
    write(root, {"tree": "now a file\n"})


FAST = [add_files, modify_files, delete_files, make_executable, add_symlink, delete_last_file_of_a_directory]
SWAPS = [file_becomes_directory, directory_becomes_file]


def snapshot(root: Path, skip: set[str]) -> dict[str, tuple[object, ...]]:
    """Every entry under ``root`` but ``.git`` and ``skip``: directories, links (their targets), files (their bytes
    and whether they are executable)."""
    found: dict[str, tuple[object, ...]] = {}
    for top, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            full = Path(top) / name
            rel = full.relative_to(root).as_posix()
            if rel == ".git" or rel in skip or any(rel.startswith(f"{s}/") for s in skip):
                continue
            mode = full.lstat().st_mode
            if stat.S_ISLNK(mode):
                found[rel] = ("link", os.readlink(full))
            elif stat.S_ISDIR(mode):
                found[rel] = ("dir",)
            else:
                found[rel] = ("file", full.read_bytes(), bool(mode & stat.S_IXUSR))
        dirs[:] = [d for d in dirs if not (Path(top) / d).is_symlink() and (Path(top) / d).name != ".git"]
    return found


def index_entries(work: Path) -> list[tuple[str, str, str]]:
    entries = git.git("ls-files", "-s", "-z", cwd=work).split("\0")
    return sorted((e.split(" ")[0], e.split(" ")[1], e.split("\t", 1)[1]) for e in entries if e)


def tree_entries(work: Path, commit: str) -> list[tuple[str, str, str]]:
    entries = git.git("ls-tree", "-r", "-z", commit, cwd=work).split("\0")
    return sorted((e.split(" ")[0], e.split(" ")[2].split("\t")[0], e.split("\t", 1)[1]) for e in entries if e)


def assert_exact(clone: Clone, work: Path, commit: str, kept: tuple[str, ...] = ()) -> None:
    """``work`` is what a fresh checkout of ``commit`` is: HEAD, the index (as ``commit``'s tree), every file,
    mode, link and directory; nothing else but the ignored ``kept`` (as ``git status`` names them)."""
    assert head(work) == commit
    assert index_entries(work) == tree_entries(work, commit)
    # --no-optional-locks: status writes no refreshed index (a settled workspace's index is the settle's own).
    listed = git.git("--no-optional-locks", "status", "--porcelain=v1", "-z", "--ignored", cwd=work)
    status = [e for e in listed.split("\0") if e]
    assert sorted(status) == sorted(f"!! {name}" for name in kept), "nothing but the kept ignored files"
    fresh = clone.root / f"fresh-{commit[:12]}"
    git.git("worktree", "add", "--quiet", "--detach", str(fresh), commit, cwd=clone.paths.bare)
    try:
        skip = {name.rstrip("/") for name in kept}
        assert snapshot(work, skip) == snapshot(fresh, set())
    finally:
        git.git("worktree", "remove", "--force", str(fresh), cwd=clone.paths.bare)


@pytest.fixture
def full_passes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The commits the full pass (checkout --force and clean) put the workspace at, in order."""
    calls: list[str] = []
    real = workspace._move

    def counted(path: Path, commit: str, *, pristine: bool) -> None:
        calls.append(commit)
        real(path, commit, pristine=pristine)

    monkeypatch.setattr(workspace, "_move", counted)
    return calls


def laid_out(clone: Clone) -> str:
    """The layout's commit, fetched, the workspace checked out at it with a warm ignored cache, and settled."""
    base = clone.change(lambda root: write(root, LAYOUT), "layout")
    work = clone.check_out(base)
    write(work, {"build/cache.o": "warm\n"})
    assert workspace.settle(clone.paths.bare, work, base, pristine=False)
    assert workspace.settled_at(work) is not None
    return base


def wait_settled(path: Path) -> None:
    """Until the background settle of ``path`` let its lock go."""
    held = workspace.lock(path)
    assert held.acquire(timeout=60), "the background settle did not finish"
    held.release()


@pytest.mark.parametrize("change", FAST, ids=lambda change: change.__name__)
def test_a_settled_workspace_moved_by_the_change_alone_is_a_fresh_checkout(
    clone: Clone, full_passes: list[str], change: Callable[[Path], None]
) -> None:
    base = laid_out(clone)
    target = clone.change(change, change.__name__)
    full_passes.clear()

    work = clone.check_out(target)
    assert full_passes == [], "moved by the change alone"
    assert workspace.settled_at(work) is None, "the mark is gone before the gates run"
    assert_exact(clone, work, target, kept=("build/",))
    assert base != target


@pytest.mark.parametrize("change", SWAPS, ids=lambda change: change.__name__)
def test_a_file_and_a_directory_trading_places_take_the_full_pass_and_are_exact(
    clone: Clone, full_passes: list[str], change: Callable[[Path], None]
) -> None:
    laid_out(clone)
    target = clone.change(change, change.__name__)
    full_passes.clear()

    work = clone.check_out(target)
    assert full_passes == [target]
    assert_exact(clone, work, target, kept=("build/",))


def test_what_the_fast_move_does_not_do_exactly_takes_the_full_pass(
    clone: Clone, full_passes: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    base = laid_out(clone)
    work = clone.paths.workspace

    # A changed ignore rule: the full pass removes what is no longer ignored (build/ here).
    rules = clone.change(lambda root: write(root, {".gitignore": "other/\n"}), "rules")
    full_passes.clear()
    clone.check_out(rules)
    assert full_passes == [rules]
    assert_exact(clone, work, rules)

    # Settled at another mode (pristine asked for now).
    workspace.settle(clone.paths.bare, work, rules, pristine=False)
    target = clone.change(modify_files, "modify")
    full_passes.clear()
    clone.check_out(target, pristine=True)
    assert full_passes == [target]
    assert_exact(clone, work, target)

    # More paths than a fast move takes.
    workspace.settle(clone.paths.bare, work, target, pristine=False)
    monkeypatch.setattr(tree_moves, "MAX_PATHS", 1)
    many = clone.change(add_files, "many")
    full_passes.clear()
    clone.check_out(many)
    assert full_passes == [many]
    assert_exact(clone, work, many)
    assert base != many


def test_a_git_that_ran_in_a_settled_workspace_or_a_failing_move_takes_the_full_pass(
    clone: Clone, full_passes: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    base = laid_out(clone)
    work = clone.paths.workspace

    # Something staged a file after the settle: the index is not the one the full pass wrote.
    write(work, {"staged.txt": "not the commit's\n"})
    git.git("add", "staged.txt", cwd=work)
    target = clone.change(modify_files, "modify")
    full_passes.clear()
    clone.check_out(target)
    assert full_passes == [target]
    assert_exact(clone, work, target, kept=("build/",))

    # A git of the fast move fails (its settled commit is gone from the clone, say): the full pass does it all.
    workspace.settle(clone.paths.bare, work, target, pristine=False)
    settled = workspace.settled_at(work)
    assert settled is not None
    workspace._settled[work] = settled._replace(commit="0" * 40)
    after = clone.change(delete_files, "delete")
    full_passes.clear()
    clone.check_out(after)
    assert full_passes == [after]
    assert_exact(clone, work, after, kept=("build/",))
    assert base != after


def test_a_process_that_never_settled_the_workspace_takes_the_full_pass(clone: Clone, full_passes: list[str]) -> None:
    base = laid_out(clone)
    work = clone.paths.workspace
    workspace._settled.clear()  # as a restarted process finds it: nothing remembered
    target = clone.change(add_files, "add")
    full_passes.clear()
    clone.check_out(target)
    assert full_passes == [target]
    assert_exact(clone, work, target, kept=("build/",))
    assert base != target


HOSTILE_GATE = """
set -e
echo junk > junk.txt
mkdir -p newdir/deeper && echo x > newdir/deeper/f
echo changed by the gate >> pkg/a.py
chmod +x pkg/b.py
rm -f tool.sh
ln -s / root-link
rm -rf dir && ln -s "$OUTSIDE" dir
mkdir -p build && echo warm > build/cache.o
gitdir=$(sed 's/^gitdir: //' .git)
echo 0000000000000000000000000000000000000000 > "$gitdir/MERGE_HEAD"
: > "$gitdir/index.lock"
"""


def test_what_a_gate_did_is_undone_by_the_background_settle_and_the_next_probe_is_exact(
    clone: Clone, full_passes: list[str], tmp_path: Path
) -> None:
    base = clone.change(lambda root: write(root, LAYOUT), "layout")
    outside = tmp_path / "outside"
    write(outside, {"inner": "inside a directory\n"})  # what a tracked directory's link finds: the same file
    place = execution.Place(
        clone=clone.paths.bare, workspace=clone.paths.workspace, logs=clone.paths.logs, records=clone.paths.gates,
        home="demo",
    )  # fmt: skip
    env = {**execution.gate_environment((), os.environ), "OUTSIDE": str(outside)}
    prober = execution.Prober(place, env, timeout=60)

    results = prober.probe(base, [GateCommand(gate="test", command=HOSTILE_GATE)], "hostile")
    assert [r.exit_code for r in results] == [0], results[0].tail
    work = clone.paths.workspace
    wait_settled(work)
    assert workspace.settled_at(work) == (base, False, workspace._index_stamp(work))
    assert_exact(clone, work, base, kept=("build/",))
    assert snapshot(outside, set()) == {"inner": ("file", b"inside a directory\n", False)}, "nothing written through"

    target = clone.change(modify_files, "modify")
    full_passes.clear()
    clone.check_out(target)
    assert full_passes == [], "moved by the change alone"
    assert_exact(clone, work, target, kept=("build/",))


def test_a_settle_that_fails_leaves_the_workspace_unsettled_for_the_full_pass(
    clone: Clone, full_passes: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    base = clone.change(lambda root: write(root, LAYOUT), "layout")
    work = clone.paths.workspace
    in_settle = threading.Event()
    real = git.checkout_clean

    def crashing(path: Path, checkout: tuple[str, ...], clean: str) -> None:
        if threading.current_thread() is not threading.main_thread():
            in_settle.set()
            raise RuntimeError("the background pass crashed")
        real(path, checkout, clean)

    monkeypatch.setattr(git, "checkout_clean", crashing)
    with workspace.used(clone.paths.bare, work, base, pristine=False):
        write(work, {"junk.txt": "a gate's\n", "pkg/a.py": "changed by a gate\n"})
    wait_settled(work)
    assert in_settle.is_set()
    assert workspace.settled_at(work) is None

    target = clone.change(add_files, "add")
    full_passes.clear()
    clone.check_out(target)
    assert full_passes == [target]
    assert_exact(clone, work, target)


def test_a_settle_that_hangs_is_waited_for_a_while_never_forever(clone: Clone, monkeypatch: pytest.MonkeyPatch) -> None:
    base = clone.change(lambda root: write(root, LAYOUT), "layout")
    work = clone.paths.workspace
    release = threading.Event()
    real = git.checkout_clean

    def hanging(path: Path, checkout: tuple[str, ...], clean: str) -> None:
        if threading.current_thread() is not threading.main_thread():
            release.wait(60)
        real(path, checkout, clean)

    monkeypatch.setattr(git, "checkout_clean", hanging)
    with workspace.used(clone.paths.bare, work, base, pristine=False):
        pass
    try:
        assert not workspace.wait_for_settles(0.2), "still settling: given up on, not waited for"
        assert not workspace.lock(work).acquire(blocking=False), "the settle holds the workspace"
    finally:
        release.set()
    assert workspace.wait_for_settles(60)
    wait_settled(work)
    assert workspace.settled_at(work) is not None


def test_a_held_settle_starts_once_released_or_when_the_workspace_is_wanted_again(
    clone: Clone, full_passes: list[str]
) -> None:
    base = clone.change(lambda root: write(root, LAYOUT), "layout")
    work = clone.paths.workspace
    with workspace.used(clone.paths.bare, work, base, pristine=False, hold=True):
        write(work, {"junk.txt": "a gate's\n"})
    assert not workspace.lock(work).acquire(blocking=False), "held back, holding the workspace"
    assert workspace.settled_at(work) is None
    workspace.release_settle(work)
    wait_settled(work)
    assert workspace.settled_at(work) is not None
    assert_exact(clone, work, base, kept=())

    # Held again and never released: the next use lets it go first (no deadlock), then moves by the change alone.
    target = clone.change(modify_files, "modify")
    with workspace.used(clone.paths.bare, work, base, pristine=False, hold=True):
        write(work, {"pkg/a.py": "changed by a gate\n"})
    full_passes.clear()
    with workspace.used(clone.paths.bare, work, target, pristine=False, hold=True):
        assert full_passes == [base], "the held settle ran (the full pass at the probed commit), then a fast move"
        assert_exact(clone, work, target)
    assert workspace.wait_for_settles(60), "a held settle starts when the process waits for them (shutdown)"
    assert workspace.settled_at(work) is not None
