"""What a root witness does with files in directories an agent owns (its workspace, runtime dir, publish folder),
as the red team attacked it (GT_AGENT_USER): never written, changed or read through a link the agent put there,
never blocked on a FIFO it put there, never a directory fetched as a bundle. Each test plants the trap as the
agent would and checks the file it aimed at is untouched (or the call returns at once)."""

from __future__ import annotations

import errno
import os
import pwd
import stat
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.witness.effects import runtime_setup
from shared.host import git, safe_files
from shared.host.os_user import OsUser
from shared.model import usage
from shared.model.runtimes import ClaudeRuntime, runtime_for
from tests.claude_code import TEST_KEY, claude_binary
from tests.os_users import remove_user


@pytest.fixture
def agent() -> Iterator[OsUser]:
    if os.geteuid() != 0:
        pytest.fail("this test creates a throwaway user (useradd): run it as root, as CI does")
    name = f"gtaf{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--system", "--no-create-home", name], check=True, capture_output=True, timeout=60)
    entry = pwd.getpwnam(name)
    try:
        yield OsUser(name=name, uid=entry.pw_uid, gid=entry.pw_gid, switch=True)
    finally:
        remove_user(name)


def victim(tmp_path: Path, name: str = "victim") -> Path:
    """A root file the agent wants written, chmodded or given to it."""
    path = tmp_path / name
    path.write_text("root's\n")
    path.chmod(0o644)
    return path


def test_writes_below_an_agents_directory_follow_no_link(tmp_path: Path) -> None:
    target = victim(tmp_path)
    work = tmp_path / "work"
    (work / ".claude").mkdir(parents=True)
    (work / ".claude" / "settings.local.json").symlink_to(target)
    with pytest.raises(safe_files.UnsafeFileError):
        safe_files.write_beneath(work, ".claude/settings.local.json", "{}")
    (work / "linked").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(safe_files.UnsafeFileError):
        safe_files.write_beneath(work, "linked/victim", "{}")
    with pytest.raises(safe_files.UnsafeFileError):
        safe_files.add_lines_beneath(work, "linked/victim", ("x",))
    assert target.read_text() == "root's\n"
    safe_files.add_lines_beneath(work, ".git/info/exclude", ("a", "b"))
    safe_files.add_lines_beneath(work, ".git/info/exclude", ("b", "c"))
    assert (work / ".git" / "info" / "exclude").read_text() == "a\nb\nc\n", "only what is missing is added"


def test_a_replaced_file_is_never_written_through_a_link_the_agent_left(tmp_path: Path) -> None:
    """``replace_beneath`` (the start hook's answer in the agent's runtime dir): a link where the file or its
    temporary belongs is replaced or removed, never followed; the file is whole for every reader."""
    target = victim(tmp_path)
    session = tmp_path / "session"
    session.mkdir()
    (session / "start-answer").symlink_to(target)
    (session / ".start-answer.tmp").symlink_to(target)
    safe_files.replace_beneath(session, "start-answer", "the answer\n")
    assert target.read_text() == "root's\n"
    assert not (session / "start-answer").is_symlink()
    assert (session / "start-answer").read_text() == "the answer\n"
    assert not (session / ".start-answer.tmp").exists()
    (session / "start-answer").unlink()
    (session / "start-answer").mkdir()
    with pytest.raises(OSError):  # noqa: PT011 - a directory is never replaced, whatever errno says so
        safe_files.replace_beneath(session, "start-answer", "x")
    assert target.read_text() == "root's\n"


def test_reads_of_an_agents_files_never_wait_on_a_fifo_or_follow_a_link(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "hooks.log")
    with pytest.raises(safe_files.UnsafeFileError):
        safe_files.read_regular(tmp_path / "hooks.log")
    assert runtime_setup.hook_log(tmp_path) == ""
    os.mkfifo(tmp_path / "agent-failure.json")
    assert runtime_setup.agent_failure(tmp_path) is None
    (tmp_path / "link").symlink_to(victim(tmp_path))
    with pytest.raises(safe_files.UnsafeFileError):
        safe_files.read_regular(tmp_path / "link")
    work = tmp_path / "work"
    (work / ".git").mkdir(parents=True)
    os.mkfifo(work / ".git" / "HEAD")
    assert git.workspace_branch(work) is None, "a FIFO for HEAD is no branch, and no wait"


def test_an_agents_index_is_copied_by_the_kernel_only_as_a_regular_file_of_its_own(tmp_path: Path) -> None:
    """The trusted index is copied out of the workspace right after the witness's checkout (``keep_index``): a
    link, a link on the way, a FIFO or a hard link to another file there is refused; a regular file is copied
    exactly, up to the cap."""
    work, kept = tmp_path / "work", tmp_path / "kept.index"
    (work / ".git").mkdir(parents=True)
    index = os.urandom(3 * 1024 * 1024 + 17)
    (work / ".git" / "index").write_bytes(index)
    safe_files.copy_beneath(work, ".git/index", kept)
    assert kept.read_bytes() == index
    safe_files.copy_beneath(work, ".git/index", kept, cap=1000)
    assert kept.read_bytes() == index[:1000], "truncated: what was there before is not kept past the cap"
    safe_files.copy_regular(kept, tmp_path / "again")
    assert (tmp_path / "again").read_bytes() == index[:1000]

    secret = victim(tmp_path)
    (work / ".git" / "index").unlink()
    (work / ".git" / "index").symlink_to(secret)
    with pytest.raises(safe_files.UnsafeFileError):
        safe_files.copy_beneath(work, ".git/index", kept)
    (work / ".git" / "index").unlink()
    os.link(secret, work / ".git" / "index")
    with pytest.raises(safe_files.UnsafeFileError):
        safe_files.copy_beneath(work, ".git/index", kept)
    (work / ".git" / "index").unlink()
    os.mkfifo(work / ".git" / "index")
    with pytest.raises(safe_files.UnsafeFileError):
        safe_files.copy_beneath(work, ".git/index", kept)
    other = tmp_path / "other"
    (other / ".git").mkdir(parents=True)
    (other / ".git" / "index").symlink_to(secret)
    (work / ".git").rename(tmp_path / "old-git")
    (work / ".git").symlink_to(other / ".git")
    with pytest.raises(safe_files.UnsafeFileError):
        safe_files.copy_beneath(work, ".git/index", kept)
    assert kept.read_bytes() == index[:1000], "nothing of the file the links name was copied"


def test_a_tree_removed_or_handed_over_changes_no_file_its_links_name(tmp_path: Path, agent: OsUser) -> None:
    target = victim(tmp_path)
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "f").symlink_to(target)
    (tree / "d").symlink_to(tmp_path, target_is_directory=True)
    agent.hand_over(tree)
    assert target.stat().st_uid == 0, "what a link names is not handed over"
    assert (tree / "sub" / "f").lstat().st_uid == agent.uid, "the link itself is"
    with pytest.raises(OSError, match=r"Not a directory|Too many levels") as refused:
        agent.hand_over(tree / "d")
    assert refused.value.errno in (errno.ELOOP, errno.ENOTDIR), refused.value
    assert tmp_path.stat().st_uid == 0
    # The clean-up: links removed themselves (never what they name), a FIFO removed unopened, read-only parts too.
    os.mkfifo(tree / "sub" / "fifo")
    (tree / "sub").chmod(0o500)
    above = stat.S_IMODE(tmp_path.stat().st_mode)
    git.force_remove(tree)
    assert not os.path.lexists(tree)
    assert target.read_text() == "root's\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert stat.S_IMODE(tmp_path.stat().st_mode) == above, "nor a directory a link named"
    assert (tmp_path / "victim").exists()
    git.force_remove(tmp_path / "never-made" / "tree")  # nothing there, not even its parent: nothing to do


def rig_with_main(tmp_path: Path) -> tuple[Path, Path]:
    """A rig's bare repository with one commit on main, and the checkout it was pushed from."""
    origin, src = tmp_path / "bare.git", tmp_path / "src"
    git.git("init", "--quiet", "--bare", "-b", "main", str(origin))
    git.git("init", "--quiet", "-b", "main", str(src))
    (src / "a").write_text("a\n")
    git.git("add", "a", cwd=src)
    git.git("-c", "user.name=t", "-c", "user.email=t@t.invalid", "commit", "-qm", "init", cwd=src)
    git.git("push", "-q", str(origin), "main", cwd=src)
    return origin, src


def test_a_directory_named_as_a_bundle_is_not_fetched(tmp_path: Path) -> None:
    origin, src = rig_with_main(tmp_path)
    fake = tmp_path / "published" / "x.bundle"
    git.git("clone", "--quiet", str(src), str(fake))  # a repository where a bundle was
    made = git.ensure_worktree(origin, tmp_path / "ws", "polecat/a/b", "main", published=fake)
    assert made
    assert git.git("rev-parse", "--verify", "--quiet", git.PUBLISHED_REF, cwd=tmp_path / "ws", check=False) == ""


def test_claude_code_is_prepared_in_an_agents_workspace_without_writing_through_its_links(
    tmp_path: Path, agent: OsUser
) -> None:
    """H1 of the red team: the agent of a workspace used before left `.claude/settings.local.json` and
    `.git/info/exclude` as links to root's files; the next session's preparation (root) refuses to write through
    them, and the files they name are unchanged."""
    settings_target, exclude_target = victim(tmp_path, "ld.so.preload"), victim(tmp_path, "exclude-target")
    work = tmp_path / "work"
    git.git("init", "--quiet", "-b", "main", str(work))
    (work / ".claude").mkdir()
    (work / ".claude" / "settings.local.json").symlink_to(settings_target)
    (work / ".git" / "info").mkdir(exist_ok=True)
    (work / ".git" / "info" / "exclude").unlink(missing_ok=True)
    (work / ".git" / "info" / "exclude").symlink_to(exclude_target)
    agent.hand_over(work)
    runtime = runtime_for("claude")
    assert isinstance(runtime, ClaudeRuntime)
    env = {"GT_CLAUDE_BIN": str(claude_binary()), "ANTHROPIC_API_KEY": TEST_KEY, "PATH": os.environ["PATH"]}
    with pytest.raises(safe_files.UnsafeFileError):
        runtime_setup.prepare(
            runtime,
            worktree=work,
            session_dir=tmp_path / "session",
            env=env,
            as_root=False,
            owner=(agent.uid, agent.gid),
        )
    assert settings_target.read_text() == "root's\n"
    assert exclude_target.read_text() == "root's\n"
    # Without the traps the same preparation writes its files, the agent's.
    (work / ".claude" / "settings.local.json").unlink()
    (work / ".git" / "info" / "exclude").unlink()
    runtime_setup.prepare(
        runtime, worktree=work, session_dir=tmp_path / "session", env=env, as_root=False, owner=(agent.uid, agent.gid)
    )
    written = work / ".claude" / "settings.local.json"
    assert written.lstat().st_uid == agent.uid
    assert ".claude/settings.local.json" in (work / ".git" / "info" / "exclude").read_text()


def test_what_an_agent_writes_for_the_witness_to_parse_cannot_exhaust_its_stack(tmp_path: Path) -> None:
    """A failure record or a transcript line nested deep enough for json's recursion to fail is read as nothing,
    never an error that stops every patrol (the red team's second pass)."""
    (tmp_path / "agent-failure.json").write_text("[" * 100_000)
    assert runtime_setup.agent_failure(tmp_path) is None
    assert usage.parse_line("[" * 100_000) is None


def test_a_hard_link_to_someone_elses_file_is_neither_written_nor_given_away(tmp_path: Path, agent: OsUser) -> None:
    """Where hard links to others' files can be made (``fs.protected_hardlinks=0``, a container's host may say so):
    root made one here, as such an agent would."""
    target = victim(tmp_path)
    home = tmp_path / "session" / "home"
    home.mkdir(parents=True)
    os.link(target, home / ".gitconfig")
    with pytest.raises(safe_files.UnsafeFileError):
        safe_files.write_beneath(tmp_path / "session", "home/.gitconfig", "x")
    with pytest.raises(safe_files.UnsafeFileError):
        safe_files.add_lines_beneath(tmp_path / "session", "home/.gitconfig", ("x",))
    agent.hand_over(tmp_path / "session")
    assert target.read_text() == "root's\n"
    assert target.stat().st_uid == 0, "not given away"


def test_a_published_bundle_too_large_does_not_seed_a_workspace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    origin, src = rig_with_main(tmp_path)
    git.git("checkout", "-q", "-b", "polecat/a/b", cwd=src)
    (src / "b").write_text("b\n")
    git.git("add", "b", cwd=src)
    git.git("-c", "user.name=t", "-c", "user.email=t@t.invalid", "commit", "-qm", "work", cwd=src)
    bundle = tmp_path / "published" / "x.bundle"
    bundle.parent.mkdir()
    git.git("bundle", "create", "--quiet", str(bundle), "polecat/a/b", "^main", cwd=src)
    monkeypatch.setattr(git, "SEED_MAX_BYTES", bundle.stat().st_size - 1)
    git.ensure_worktree(origin, tmp_path / "small", "polecat/a/b", "main", published=bundle)
    assert not (tmp_path / "small" / "b").exists(), "not seeded from a bundle over the cap"
    monkeypatch.setattr(git, "SEED_MAX_BYTES", bundle.stat().st_size)
    git.ensure_worktree(origin, tmp_path / "seeded", "polecat/a/b", "main", published=bundle)
    assert (tmp_path / "seeded" / "b").exists(), "seeded from one within it"
