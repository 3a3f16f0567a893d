"""git, run as a subprocess: a rig's canonical (bare) clone and one worktree per polecat.

The only module that runs git. Every function is blocking; async callers run them in a thread. Worktrees
with uncommitted or unpushed work are never removed. Git runs with an allowlisted environment
(``git_environment``) and with the hooks and fsmonitor a repository's config may name turned off
(``GIT_SAFE_CONFIG``): an agent can write the config of the clone its worktree shares with the witness.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import uuid
from collections.abc import Mapping
from pathlib import Path

import msgspec

from shared.errors import GastownError

GIT_TIMEOUT_S = 120.0
PROBE_TIMEOUT_S = 30.0
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class GitError(GastownError):
    """A git command failed; ``stderr`` says why."""

    def __init__(self, args: list[str], returncode: int, stderr: str) -> None:
        self.args_ = args
        self.returncode = returncode
        self.stderr = stderr.strip()
        super().__init__(f"git {' '.join(args)} failed ({returncode}): {self.stderr[-2000:]}")


class WorktreeNotEmptyError(GastownError):
    """A worktree holds uncommitted or unpushed work and was left in place."""

    def __init__(self, path: Path, dirty: bool, unpushed: int) -> None:
        self.path = path
        self.dirty = dirty
        self.unpushed = unpushed
        what = [w for w, on in (("uncommitted changes", dirty), (f"{unpushed} unpushed commits", unpushed)) if on]
        super().__init__(f"worktree {path} has {' and '.join(what)}; it is kept")


class WorktreeState(msgspec.Struct, frozen=True, kw_only=True):
    exists: bool
    branch: str | None = None
    head: str | None = None
    dirty: bool = False
    """Uncommitted changes, untracked files included."""
    changes: tuple[str, ...] = ()
    """The paths ``git status`` shows changed or untracked (an untracked folder as one path ending in ``/``)."""
    unpushed: int = 0
    """Commits on the branch that the rig's origin does not have."""


GIT_ENV = {
    "GIT_TERMINAL_PROMPT": "0",  # never wait for a password nobody will type
    "GIT_AUTHOR_NAME": "gastown",
    "GIT_AUTHOR_EMAIL": "gastown@localhost",
    "GIT_COMMITTER_NAME": "gastown",
    "GIT_COMMITTER_EMAIL": "gastown@localhost",
}
_PROXIES = ("http_proxy", "https_proxy", "no_proxy", "all_proxy")
GIT_BASE_ENV = (
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR",
    "SSH_AUTH_SOCK", "SSL_CERT_FILE", "SSL_CERT_DIR", "GIT_SSH", "GIT_SSH_COMMAND", "GIT_ASKPASS", "SSH_ASKPASS",
    "GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM", "GIT_CONFIG_NOSYSTEM", "XDG_CONFIG_HOME",
    *_PROXIES, *(name.upper() for name in _PROXIES),
)  # fmt: skip
"""What git gets of the environment of the process that runs it, besides ``GIT_ENV`` and the names ``GT_GIT_ENV``
lists: git runs hooks, filters and helpers that a repository (or an agent writing its config) may name, so never
the service's NATS credentials, the town's settings or whatever else the host holds."""
GIT_ENV_SETTING = "GT_GIT_ENV"
GIT_SAFE_CONFIG = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false")
"""Given to every git this module runs: hooks and an fsmonitor a repository's config names (an agent can write
the config its worktree shares with the rig's clone) never run inside a service's git. A push's receiving side
runs in the target repository, whose own hooks are its owner's business (they see the allowlisted environment)."""


def git_env_names(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The names ``GT_GIT_ENV`` lists (comma-separated): more variables git gets, for a site's needs (a
    credential helper's variable, say).

    Raises:
        ValueError: a name is not a variable name, or is the town's (``GT_*``, ``NATS_*``): never git's.
    """
    environ = os.environ if environ is None else environ
    names = tuple(name.strip() for name in environ.get(GIT_ENV_SETTING, "").split(",") if name.strip())
    bad = [name for name in names if not _ENV_NAME.fullmatch(name)]
    if bad:
        raise ValueError(f"{GIT_ENV_SETTING} must list environment variable names, got {', '.join(map(repr, bad))}")
    town = [name for name in names if name.upper().startswith("GT_") or "NATS_" in name.upper()]
    if town:
        raise ValueError(
            f"{GIT_ENV_SETTING} may not name the town's settings or credentials (GT_*, NATS_*): "
            f"{', '.join(town)} (git runs hooks and helpers a repository names)"
        )
    return names


def git_environment(environ: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """The environment git runs with: the allowlisted variables of ``environ`` (``GIT_BASE_ENV`` and the names
    ``GT_GIT_ENV`` lists) that are set, ``GIT_ENV`` and ``extra``.

    Raises:
        ValueError: ``GT_GIT_ENV`` cannot be used (``git_env_names``).
    """
    environ = os.environ if environ is None else environ
    names = (*GIT_BASE_ENV, *git_env_names(environ))
    return {**{key: environ[key] for key in names if key in environ}, **GIT_ENV, **extra}


def _run(args: list[str], cwd: Path | None, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", *GIT_SAFE_CONFIG, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


class PushResult(msgspec.Struct, frozen=True, kw_only=True):
    exit_code: int
    """0 when the ref was updated; -1 when git did not finish in time."""
    stderr: str = ""
    """What git said, in English (the push runs with ``LC_ALL=C``), to be told apart by cause."""


BUILD_OUTPUT = (
    "__pycache__/", "*.py[cod]", ".pytest_cache/", ".mypy_cache/", ".ruff_cache/", ".tox/", "*.egg-info/",
    ".coverage", "node_modules/",
)  # fmt: skip
"""Common output of builds and test runs, never an agent's work: listed in each rig clone's ``info/exclude`` when
the witness prepares a worktree (``exclude_from_git``), for every agent runtime, so a project without a
``.gitignore`` for it keeps a clean ``git status`` after its tests ran and ``gt done`` is not refused for bytecode."""

UPDATE_INSTEAD_RECEIVE_PACK = "git -c receive.denyCurrentBranch=updateInstead receive-pack"
"""The receiving side of a push into a local non-bare repository: the checked-out branch is updated together
with its work tree when that is clean, and the push is refused with git's reason when it is not."""


def git(*args: str, cwd: Path | None = None, timeout: float = GIT_TIMEOUT_S, check: bool = True) -> str:
    """Run git; its stdout.

    Raises:
        GitError: git exited non-zero (with ``check``) or timed out.
    """
    try:
        env = git_environment()
    except ValueError as exc:
        raise GitError(list(args), -1, str(exc)) from exc
    try:
        done = _run(list(args), cwd, env, timeout)
    except subprocess.TimeoutExpired as exc:
        raise GitError(list(args), -1, f"timed out after {timeout}s") from exc
    if check and done.returncode != 0:
        raise GitError(list(args), done.returncode, done.stderr)
    return done.stdout


def push_commit(work: Path, commit: str, branch: str, *, receive_pack: str | None = None) -> PushResult:
    """Push ``commit`` to ``branch`` of origin as a fast-forward; git's exit code and English stderr (never raises
    for a refusal: the caller tells the causes apart)."""
    args = ["push", "--quiet"]
    if receive_pack:
        args.append(f"--receive-pack={receive_pack}")
    args += ["--", "origin", f"{commit}:refs/heads/{branch}"]
    try:
        env = git_environment(LC_ALL="C", LANGUAGE="")
    except ValueError as exc:
        return PushResult(exit_code=1, stderr=str(exc))
    try:
        done = _run(args, work, env, GIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return PushResult(exit_code=-1, stderr=f"git push timed out after {GIT_TIMEOUT_S:g}s")
    return PushResult(exit_code=done.returncode, stderr=done.stderr)


def local_repository(repo: str) -> Path | None:
    """The directory of ``repo`` when it is a repository on this machine (a path or a file:// URL), else None."""
    if repo.startswith("file://"):
        path = Path(repo.removeprefix("file://"))
    elif "://" in repo or ":" in repo.split("/", 1)[0]:
        return None  # a URL or scp-like host:path
    else:
        path = Path(repo)
    return path if path.is_dir() else None


def is_checkout(repo: str) -> bool:
    """``repo`` is a local repository with a work tree (not bare): pushing to its checked-out branch needs care."""
    path = local_repository(repo)
    if path is None:
        return False
    return git("rev-parse", "--is-bare-repository", cwd=path, check=False).strip() == "false"


def checkout_receive_pack(repo: str) -> str | None:
    """The receive-pack a push into ``repo`` should run: for a local checkout whose owner set no
    ``receive.denyCurrentBranch``, one that updates the checked-out branch's clean work tree instead of refusing
    (see ``UPDATE_INSTEAD_RECEIVE_PACK``); None (git's default) otherwise, an owner's own setting included."""
    path = local_repository(repo)
    if path is None or not is_checkout(repo):
        return None
    if git("config", "--get", "receive.denyCurrentBranch", cwd=path, check=False).strip():
        return None
    return UPDATE_INSTEAD_RECEIVE_PACK


def probe_repository(repo: str, branch: str) -> str | None:
    """Why ``repo`` cannot serve as a rig's origin with base ``branch``, or None when it can."""
    try:
        heads = git("ls-remote", "--heads", "--", repo, timeout=PROBE_TIMEOUT_S)
    except GitError as exc:
        return f"cannot read repository {repo!r}: {exc.stderr or exc}"
    if f"refs/heads/{branch}" not in {line.split("\t")[-1] for line in heads.splitlines()}:
        names = sorted(line.split("refs/heads/")[-1] for line in heads.splitlines() if "refs/heads/" in line)
        return f"repository {repo!r} has no branch {branch!r} (it has: {', '.join(names) or 'no branches'})"
    return None


def ensure_bare_clone(repo: str, path: Path) -> bool:
    """The rig's canonical clone of ``repo`` at ``path`` (bare); True when it had to be made.

    Cloned to a temporary name and renamed, so a crash never leaves a half clone under ``path``.
    """
    if (path / "HEAD").is_file():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        git("clone", "--bare", "--quiet", "--", repo, str(temp))
        # Remote-tracking refs, so a push records what origin has and unpushed work can be counted.
        git("config", "remote.origin.fetch", "+refs/heads/*:refs/remotes/origin/*", cwd=temp)
        git("fetch", "--quiet", "origin", cwd=temp)
        temp.rename(path)
    finally:
        if temp.exists():
            force_remove(temp)
    return True


def fetch(bare: Path) -> None:
    git("fetch", "--quiet", "--prune", "origin", cwd=bare)


def existing_refs(repo: Path, *refs: str) -> set[str]:
    """Which of the full ref names ``refs`` exist, in one git process."""
    # for-each-ref also lists refs below a pattern (refs/heads/a lists refs/heads/a/b): only exact names count.
    listed = git("for-each-ref", "--format=%(refname)", *refs, cwd=repo).splitlines()
    return set(refs).intersection(listed)


def ensure_worktree(bare: Path, path: Path, branch: str, base: str, *, refs: set[str] | None = None) -> bool:
    """A worktree at ``path`` on ``branch`` (made from ``base`` when new); True when created, False when reused.

    ``refs``: which of ``refs/heads/<branch>`` and ``refs/remotes/origin/<base>`` exist, when the caller has just
    looked (else one more git process looks). Not safe to run for two worktrees of one clone at once: git 2.39's
    ``worktree add`` reads the other worktrees' files while another add is still writing them.

    Raises:
        GitError: ``path`` exists but is not a worktree on ``branch`` (it is never touched then).
    """
    if path.exists():
        current = git("rev-parse", "--abbrev-ref", "HEAD", cwd=path, check=False).strip()
        if current != branch:
            raise GitError(["worktree", "add", str(path)], 1, f"{path} exists and is on {current!r}, not {branch!r}")
        return False
    try:
        _add_worktree(bare, path, branch, base, refs)
    except GitError as exc:
        if "already registered" not in exc.stderr:
            raise
        # A registration whose directory is gone (removed by hand, a crash in the middle of a clean-up) blocks
        # the add: pruned, then added again. Only then: a prune per start would be a git process per session.
        # Looked up again: git made the branch before it refused the path.
        git("worktree", "prune", cwd=bare)
        _add_worktree(bare, path, branch, base, None)
    return True


def worktree_refs(branch: str, base: str) -> tuple[str, str]:
    """The refs ``ensure_worktree`` looks at: the branch's, and origin's base as the clone last fetched it."""
    return f"refs/heads/{branch}", f"refs/remotes/origin/{base}"


def _add_worktree(bare: Path, path: Path, branch: str, base: str, refs: set[str] | None) -> None:
    head, tracked = worktree_refs(branch, base)
    if refs is None:
        refs = existing_refs(bare, head, tracked)
    if head in refs:
        git("worktree", "add", "--quiet", "--", str(path), branch, cwd=bare)
        return
    # Else the base's id: `worktree add -b` hands its start point on to `git branch` with no end of options.
    start = tracked if tracked in refs else resolve_commit(bare, base)
    # --no-track: a polecat's branch is its own (pushed under its own name), not one that follows the base; and
    # tracking would write the clone's config file, once per session.
    git("worktree", "add", "--quiet", "--no-track", "-b", branch, "--", str(path), start, cwd=bare)


def _ref_exists(repo: Path, ref: str) -> bool:
    return bool(git("rev-parse", "--verify", "--quiet", "--end-of-options", ref, cwd=repo, check=False).strip())


def resolve_commit(repo: Path, name: str) -> str:
    """The full id of the commit ``name`` names (a branch, a tag, an id), read as a name even when it starts
    with ``-``. For commands that cannot be told where options end (git 2.39's ``checkout``): give them the id.

    Raises:
        GitError: ``name`` names no commit.
    """
    found = git("rev-parse", "--verify", "--quiet", "--end-of-options", f"{name}^{{commit}}", cwd=repo, check=False)
    if not found.strip():
        raise GitError(["rev-parse", "--verify", name], 1, f"{name!r} names no commit")
    return found.strip()


def worktree_state(path: Path, base: str) -> WorktreeState:
    """What a worktree holds that would be lost if it were removed."""
    if not (path / ".git").exists():
        return WorktreeState(exists=False)
    branch = git("rev-parse", "--abbrev-ref", "HEAD", cwd=path).strip()
    head = git("rev-parse", "HEAD", cwd=path).strip()
    changes = status_paths(path)
    tracked = f"refs/remotes/origin/{branch}"
    upstream = tracked if _ref_exists(path, tracked) else f"refs/remotes/origin/{base}"
    if not _ref_exists(path, upstream):
        upstream = base
    unpushed = int(git("rev-list", "--count", "--end-of-options", f"{upstream}..HEAD", cwd=path).strip() or 0)
    return WorktreeState(
        exists=True, branch=branch, head=head, dirty=bool(changes), changes=tuple(changes), unpushed=unpushed
    )


def status_paths(path: Path) -> list[str]:
    """The paths ``git status`` shows in the worktree at ``path``: changed, staged or untracked (an untracked
    folder as one path ending in ``/``), ignored ones left out, in git's order."""
    entries = git("status", "--porcelain=v1", "-z", "--untracked-files=normal", cwd=path).split("\0")
    paths: list[str] = []
    renamed = False
    for entry in entries:
        if renamed:  # the original path of a rename or copy: the entry before named the new one
            renamed = False
            continue
        if len(entry) < 4:
            continue
        paths.append(entry[3:])
        renamed = entry[0] in "RC"
    return paths


def exclude_from_git(worktree: Path, patterns: tuple[str, ...]) -> None:
    """List ``patterns`` in the clone's ``info/exclude`` (local, shared by all its worktrees, never committed):
    git status stays clean, so ``gt done`` and the worktree's clean-up do not take them for unsaved work.
    Idempotent: only the patterns not listed yet are appended."""
    if not patterns:
        return
    exclude = Path(git("rev-parse", "--git-path", "info/exclude", cwd=worktree).strip())
    if not exclude.is_absolute():
        exclude = worktree / exclude
    _list_in(exclude, patterns)


def exclude_in_bare_clone(bare: Path, patterns: tuple[str, ...]) -> None:
    """``exclude_from_git`` for every worktree of the bare clone ``bare`` (its git dir, so no git process is needed
    to find the file: a session start is on the recovery path)."""
    _list_in(bare / "info" / "exclude", patterns)


def _list_in(exclude: Path, patterns: tuple[str, ...]) -> None:
    exclude.parent.mkdir(parents=True, exist_ok=True)
    present = exclude.read_text().splitlines() if exclude.exists() else []
    missing = [pattern for pattern in patterns if pattern not in present]
    if missing:
        with exclude.open("a") as out:
            out.write("".join(f"{pattern}\n" for pattern in missing))


def push(path: Path, branch: str) -> str:
    """Push ``branch`` to origin; the pushed commit."""
    git("push", "--quiet", "--", "origin", f"refs/heads/{branch}:refs/heads/{branch}", cwd=path)
    return git("rev-parse", "HEAD", cwd=path).strip()


def remove_worktree(bare: Path, path: Path, base: str) -> None:
    """Remove a worktree that holds nothing unsaved, and make sure it is gone.

    Raises:
        WorktreeNotEmptyError: it has uncommitted or unpushed work (it is kept).
        GitError: the directory would not go away.
    """
    state = worktree_state(path, base)
    if state.exists and (state.dirty or state.unpushed):
        raise WorktreeNotEmptyError(path, state.dirty, state.unpushed)
    if path.exists():
        git("worktree", "remove", "--force", str(path), cwd=bare, check=False)
        if path.exists():
            force_remove(path)
    # Not checked: clean-ups of other worktrees may prune at the same moment, and what matters is checked next.
    git("worktree", "prune", cwd=bare, check=False)
    if path.exists():
        raise GitError(["worktree", "remove", str(path)], 1, f"{path} is still there after removing it")


def force_remove(path: Path) -> None:
    """Remove a directory tree even where files or directories are read-only, and check it is gone."""
    shutil.rmtree(path, ignore_errors=True)
    if not path.exists():
        return
    for root, dirs, files in os.walk(path):
        for name in dirs:
            os.chmod(os.path.join(root, name), stat.S_IRWXU)
        for name in files:
            os.chmod(os.path.join(root, name), stat.S_IRUSR | stat.S_IWUSR)
    os.chmod(path, stat.S_IRWXU)
    shutil.rmtree(path, ignore_errors=True)
