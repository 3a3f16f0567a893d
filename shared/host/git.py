"""git, run as a subprocess: a rig's canonical (bare) clone, one workspace per polecat, and how a polecat's work
reaches the merge queue.

The only module that runs git. Every function is blocking; async callers run them in a thread.

- A polecat's **workspace** is a repository of its own (``ensure_worktree``), not a worktree of the witness's
  clone: it shares no config, hooks or refs with any repository a service uses (it borrows the clone's objects
  read-only, through git's alternates). Its ``origin`` fetches from the rig's repository and has no push URL: an
  agent has nothing to push to.
- An agent **publishes** its branch as a git bundle (``publish``, run by `gt done`, into
  ``GT_HOME/rigs/<rig>/published/<session>/``): a file of its commits, which
  the refinery imports as data (``import_bundle``: copied, size-capped, verified, fetched with object checks, the
  submitted head pinned). Nothing of the agent's repository runs in the refinery's git.
- Workspaces with uncommitted or unpublished work are never removed.

Git runs with an allowlisted environment (``git_environment``) and with the hooks and fsmonitor a repository's
config may name turned off (``GIT_SAFE_CONFIG``).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
import stat
import subprocess
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import msgspec

from shared.core.errors import GastownError
from shared.host import safe_files
from shared.host.os_user import switch_user_argv

GIT_TIMEOUT_S = 120.0
PROBE_TIMEOUT_S = 30.0
BACKGROUND_NICENESS = 10
"""How much lower the CPU priority of git run ``in_background`` is (``nice``): housekeeping that nothing waits for
(a finished session's workspace looked over for unsaved work) yields the cores to a merge running beside it."""
_background: contextvars.ContextVar[bool] = contextvars.ContextVar("git_in_background", default=False)
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
    """Commits on the branch that neither the rig's base branch has nor `gt done` has published."""


PUBLISHED_REF = "refs/gt/published"
"""In a workspace: the commit `gt done` last published (``publish``); what it reaches is not lost with it."""
IMPORTED_PREFIX = "refs/gt/published"
"""In the refinery's clone: the commits of imported bundles, one ref per session and head (``imported_ref``)."""


def imported_ref(session: str, head: str) -> str:
    """Where a session's published ``head`` is kept in the refinery's clone: only that session's merge request
    merges it."""
    return f"{IMPORTED_PREFIX}/{session or '-'}/{head}"


NO_PUSH_URL = "gt-done-publishes-this-branch"
"""A workspace's push URL: not a repository, so a `git push` fails at once (an agent publishes with gt done)."""


class Published(NamedTuple):
    """What ``publish`` made: the branch's head and the bundle holding its commits."""

    head: str
    bundle: Path


class BundleProblem(NamedTuple):
    """Why a published bundle was not imported: ``code`` is a command rejection's (``too_large``, ``invalid``)."""

    code: str
    message: str


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


CONTAINED_GRACE_S = 2.0
"""How long what a git run as another user started has to stop once that git is done (SIGKILL after)."""


@contextlib.contextmanager
def in_background() -> Iterator[None]:
    """Every git this module runs inside (in this thread or task: a context variable, which ``asyncio.to_thread``
    carries into its thread) runs at ``BACKGROUND_NICENESS``, it and all it starts."""
    token = _background.set(True)
    try:
        yield
    finally:
        _background.reset(token)


def _run(
    args: list[str], cwd: Path | None, env: dict[str, str], timeout: float, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    argv = ["git", *GIT_SAFE_CONFIG, *args]
    if _background.get():
        argv = ["nice", "-n", str(BACKGROUND_NICENESS), *argv]
    owner = _owner_of(cwd)
    if owner is None:
        return subprocess.run(
            argv, cwd=cwd, env=env, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
        )
    # Its config, attributes and filters are the owner's to write (an agent's workspace, when agents run as their
    # own user): they run with the owner's rights, never a root service's; and git refuses a repository another
    # user owns anyway. No home: nothing of root's (unreadable to it) is looked for. Under root's reaper, as a
    # pane's agent runs: whatever they start (a filter that detaches) ends with this git, and cannot hold its
    # output open past it.
    from shared.host import reaper  # here: ctypes, which the reaper's module imports, costs every gt call otherwise

    env = {**env, "HOME": "/nonexistent", "XDG_CONFIG_HOME": "/nonexistent"}
    contained = [*reaper.argv(CONTAINED_GRACE_S), *switch_user_argv(*owner), *argv]
    with subprocess.Popen(
        contained,
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()  # the reaper ends git and all it started (a SIGKILL would orphan them)
            try:
                proc.communicate(timeout=CONTAINED_GRACE_S + 5.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
            raise
        return subprocess.CompletedProcess(contained, proc.returncode, out, err)


def _owner_of(cwd: Path | None) -> tuple[int, int] | None:
    """(uid, gid) of ``cwd`` when this process is root and another user owns it; None otherwise."""
    if cwd is None or not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    try:
        found = os.stat(cwd)
    except OSError:
        return None
    return None if found.st_uid == 0 else (found.st_uid, found.st_gid)


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

LOCAL_RECEIVE_PACK = "git -c core.hooksPath=/dev/null -c core.fsmonitor=false receive-pack"
"""The receiving side of a push into a repository on this machine: without the hooks its config or its
``hooks/`` name. An agent that can write the rig's repository (the same OS user) could plant a ``pre-receive``
there, and the refinery's push would run it with the refinery's rights (root in the compose stack). A rig that
needs server-side hooks on merges is served by a git server (a URL): its hooks run there, as its own user."""
UPDATE_INSTEAD_RECEIVE_PACK = (
    "git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c receive.denyCurrentBranch=updateInstead receive-pack"
)
"""The receiving side of a push into a local non-bare repository: the checked-out branch is updated together
with its work tree when that is clean, and the push is refused with git's reason when it is not (no hooks)."""


def git(
    *args: str, cwd: Path | None = None, timeout: float = GIT_TIMEOUT_S, check: bool = True, stdin: str | None = None
) -> str:
    """Run git (``stdin``: what it reads); its stdout.

    Raises:
        GitError: git exited non-zero (with ``check``) or timed out.
    """
    try:
        env = git_environment()
    except ValueError as exc:
        raise GitError(list(args), -1, str(exc)) from exc
    try:
        done = _run(list(args), cwd, env, timeout, stdin)
    except subprocess.TimeoutExpired as exc:
        raise GitError(list(args), -1, f"timed out after {timeout}s") from exc
    if check and done.returncode != 0:
        raise GitError(list(args), done.returncode, done.stderr)
    return done.stdout


def _succeeds(*args: str, cwd: Path | None = None) -> bool:
    """Whether git exits 0 (its output dropped)."""
    try:
        return _run(list(args), cwd, git_environment(), GIT_TIMEOUT_S).returncode == 0
    except (ValueError, subprocess.TimeoutExpired):
        return False


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


def as_owner_of(path: Path) -> str:
    """A command prefix that runs the other side of a transfer with a repository on this machine as the user who
    owns it, when this process is root and the repository is another user's (the compose stack's refinery is root;
    the rig's repository belongs to the agents' user): whatever that repository's config or hooks name (an agent
    can write them) then runs with no more rights than the agent has. Empty otherwise."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return ""
    try:
        owner = os.stat(path)
    except OSError:
        return ""
    if owner.st_uid == 0:
        return ""
    return f"setpriv --reuid={owner.st_uid} --regid={owner.st_gid} --clear-groups "


def upload_pack_for(repo: str) -> list[str]:
    """``--upload-pack=...`` for a fetch, clone or ls-remote of ``repo`` when it is a repository on this machine
    another user owns and this process is root (``as_owner_of``); nothing otherwise."""
    path = local_repository(repo)
    prefix = as_owner_of(path) if path is not None else ""
    return [f"--upload-pack={prefix}git-upload-pack"] if prefix else []


def checkout_receive_pack(repo: str) -> str | None:
    """The receive-pack a push into ``repo`` should run: for a repository on this machine one that runs no hook
    (``LOCAL_RECEIVE_PACK``), and for a local checkout whose owner set no ``receive.denyCurrentBranch`` one that also
    updates the checked-out branch's clean work tree instead of refusing (``UPDATE_INSTEAD_RECEIVE_PACK``); None
    (git's default, run by the server) for a URL."""
    path = local_repository(repo)
    if path is None:
        return None
    prefix = as_owner_of(path)
    if not is_checkout(repo) or git("config", "--get", "receive.denyCurrentBranch", cwd=path, check=False).strip():
        return prefix + LOCAL_RECEIVE_PACK
    return prefix + UPDATE_INSTEAD_RECEIVE_PACK


def origin_receive_pack(clone: Path) -> list[str]:
    """``--receive-pack=...`` for a push from ``clone`` to its origin (``checkout_receive_pack`` of its URL), or
    nothing."""
    url = git("config", "--get", "remote.origin.url", cwd=clone, check=False).strip()
    receive_pack = checkout_receive_pack(url) if url else None
    return [f"--receive-pack={receive_pack}"] if receive_pack else []


def probe_repository(repo: str, branch: str) -> str | None:
    """Why ``repo`` cannot serve as a rig's origin with base ``branch``, or None when it can."""
    try:
        heads = git("ls-remote", *upload_pack_for(repo), "--heads", "--", repo, timeout=PROBE_TIMEOUT_S)
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
        git("clone", "--bare", "--quiet", *upload_pack_for(repo), "--", repo, str(temp))
        # Remote-tracking refs: what origin has, as of the last fetch.
        git("config", "remote.origin.fetch", "+refs/heads/*:refs/remotes/origin/*", cwd=temp)
        # Workspaces borrow these objects (alternates): none may ever be pruned from under them.
        git("config", "gc.pruneExpire", "never", cwd=temp)
        _set_upload_pack(temp, repo)
        git("fetch", "--quiet", "origin", cwd=temp)
        temp.rename(path)
    finally:
        if temp.exists():
            force_remove(temp)
    return True


def _set_upload_pack(clone: Path, repo: str) -> None:
    """Record in ``clone``'s own config the upload-pack its fetches from origin run (``upload_pack_for``)."""
    option = upload_pack_for(repo)
    if option:
        git("config", "remote.origin.uploadpack", option[0].removeprefix("--upload-pack="), cwd=clone)


def fetch(bare: Path) -> None:
    url = git("config", "--get", "remote.origin.url", cwd=bare, check=False).strip()
    if url:
        _set_upload_pack(bare, url)  # a clone made by an older version, or a repository whose owner changed
    git("fetch", "--quiet", "--prune", "origin", cwd=bare)


def fetch_ref(bare: Path, ref: str) -> None:
    """Fetch ``ref`` (a full name, e.g. ``refs/gt/gate/<job>``) from origin into the same name in ``bare``."""
    git("fetch", "--quiet", "--no-tags", "origin", f"+{ref}:{ref}", cwd=bare)


def push_refs(clone: Path, refspecs: Sequence[str]) -> None:
    """Push ``refspecs`` (``<commit>:<ref>``, or ``:<ref>`` to delete) from ``clone`` to origin in one push, forced
    (they are the service's own refs, never a branch of anyone's)."""
    if refspecs:
        receive = origin_receive_pack(clone)
        git("push", "--quiet", "--force", *receive, "--", "origin", *refspecs, cwd=clone)


def existing_refs(repo: Path, *refs: str) -> set[str]:
    """Which of the full ref names ``refs`` exist, in one git process."""
    # for-each-ref also lists refs below a pattern (refs/heads/a lists refs/heads/a/b): only exact names count.
    listed = git("for-each-ref", "--format=%(refname)", *refs, cwd=repo).splitlines()
    return set(refs).intersection(listed)


def ensure_worktree(
    bare: Path,
    path: Path,
    branch: str,
    base: str,
    *,
    refs: set[str] | None = None,
    origin: str | None = None,
    excludes: tuple[str, ...] = (),
    published: Path | None = None,
    recycle: Recycle | None = None,
) -> bool:
    """A polecat's workspace at ``path`` on ``branch`` (made from ``base`` when new); True when created (or
    recycled), False when reused as it is (on ``branch`` already: a later session of the same bead).

    A repository of its own, made in a new directory and renamed into place (a crash leaves no half workspace):
    its objects borrowed from the rig's clone ``bare`` (alternates, read-only), ``origin`` fetching from the rig's
    repository (``origin``, else ``bare``) with no push URL, ``excludes`` in its ``info/exclude``. Nothing of it
    is shared with ``bare``: an agent writing its config, hooks or refs writes its own. ``refs``: which of
    ``refs/heads/<branch>`` and ``refs/remotes/origin/<base>`` exist in ``bare``, when the caller has just looked.
    ``published``: the branch as an earlier session of its bead published it (a bundle): a workspace made again
    (the earlier one removed once its work was published, a merge request sent back) starts there, never from the
    base, so no published work is lost. ``recycle``: the workspace at ``path`` was released by an earlier bead of
    the polecat (nothing unsaved in it, checked then): it is moved to ``branch`` in place, its repository made anew
    (``repository_renewal``), rather than made again from nothing; without a trusted index it is made again.

    Raises:
        GitError: ``path`` exists but is not a workspace on ``branch`` and was not released (it is never touched
            then).
    """
    if path.exists() or path.is_symlink():
        current = workspace_branch(path)
        if current == branch and recycle is None:
            return False
        if recycle is None:
            shown = current if current is not None and len(current) < 200 else "no branch"
            raise GitError(["workspace", str(path)], 1, f"{path} exists and is on {shown!r}, not {branch!r}")
        if recycle.trusted_index is not None and (path / ".git").is_dir() and not path.is_symlink():
            try:
                _recycled(bare, path, branch, base, refs, origin, excludes, published, recycle)
            except (GitError, OSError):
                pass  # released: nothing unsaved in it; made again below
            else:
                return True
        force_remove(path)
        if os.path.lexists(path):
            raise GitError(["workspace", str(path)], 1, f"{path} could not be removed to be made again")
    start = WorkspaceStart.of(bare, branch, base, refs)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        git("init", "--quiet", str(temp))
        seeded = _configured(temp, bare, origin, base, start, excludes, published, branch)
        git("checkout", "--quiet", *((branch,) if seeded else ("-b", branch, start.commit)), cwd=temp)
        temp.rename(path)
    finally:
        if temp.exists():
            force_remove(temp)
    return True


class Recycle(NamedTuple):
    """How a released workspace is taken for a polecat's next bead (``ensure_worktree``)."""

    trusted_index: bytes | Path | None
    """The index as the witness's own checkout wrote it when the workspace was last prepared, before its agent ran
    (``repository_renewal.read_index``), or the file of the witness's that holds it (``keep_index``); None: not
    known, the workspace is made again."""
    scratch: Path
    """A directory of the witness's on the workspace's file system, where the new repository is made."""
    owner: tuple[int, int] | None
    """(uid, gid) the new repository is given: the agent's, when agents run as their own OS user."""
    settled: SettledWorkspace | None = None
    """Where ``settle_released`` left the workspace when it was released, if it did: it is moved from there by the
    change alone."""


class SettledWorkspace(NamedTuple):
    """A released workspace the full pass put at ``commit`` (detached) right after its session, and the identity of
    the index that pass wrote (``tree_moves.index_stamp``): any git run in it since changes that."""

    commit: str
    index_stamp: tuple[int, int, int, int]
    base: str
    origin: str | None
    excludes: tuple[str, ...]
    """The base, origin and excludes its repository was made with: a start asking for others takes the whole way."""


class WorkspaceStart(NamedTuple):
    """Where a new workspace's branch starts, and the base as the rig's clone last fetched it."""

    commit: str
    base_commit: str
    branch_in_clone: bool
    """The branch exists in the rig's clone (an older version's worktrees made it there)."""

    @classmethod
    def of(cls, bare: Path, branch: str, base: str, refs: set[str] | None) -> WorkspaceStart:
        head, tracked = worktree_refs(branch, base)
        if refs is None:
            refs = existing_refs(bare, head, tracked)
        # A branch an older version made in the clone (worktrees shared its refs), else the base as last fetched.
        named = head if head in refs else tracked if tracked in refs else base
        start = resolve_commit(bare, named)
        base_commit = resolve_commit(bare, tracked) if tracked in refs and named != tracked else start
        return cls(commit=start, base_commit=base_commit, branch_in_clone=head in refs)


def _configured(
    repo: Path,
    bare: Path,
    origin: str | None,
    base: str,
    start: WorkspaceStart,
    excludes: tuple[str, ...],
    published: Path | None,
    branch: str,
) -> bool:
    """A new workspace repository at ``repo`` set up: the clone's objects borrowed, ``origin`` (no push URL), the
    base, ``excludes``, and the branch fetched from ``published`` when it is not in the clone; whether it was."""
    objects = (bare / "objects").resolve()
    (repo / ".git" / "objects" / "info" / "alternates").write_text(f"{objects}\n")
    git("config", "remote.origin.url", origin or str(bare.resolve()), cwd=repo)
    git("config", "remote.origin.fetch", "+refs/heads/*:refs/remotes/origin/*", cwd=repo)
    git("config", "remote.origin.pushurl", NO_PUSH_URL, cwd=repo)
    git("update-ref", f"refs/remotes/origin/{base}", start.base_commit, cwd=repo)
    if excludes:
        _list_in(repo / ".git" / "info" / "exclude", excludes)
    return not start.branch_in_clone and published is not None and _seeded(repo, published, branch)


def checkout_clean(path: Path, checkout: tuple[str, ...], clean: str) -> None:
    """``git checkout --force`` (``checkout``: what follows it), then ``git clean`` (``clean``: its flags), in
    ``path``; again while the clean removed something. A link left where a tracked directory was lets the checkout
    find that directory's files (through it) unchanged; the clean then removes the link, and the files with it:
    checked out once more, they are written.

    Raises:
        GitError: git failed, or the workspace did not settle in three rounds.
    """
    for _round in range(3):
        git("checkout", "--quiet", "--force", *checkout, cwd=path, timeout=WORKSPACE_TIMEOUT_S)
        if not git("clean", clean, cwd=path, timeout=WORKSPACE_TIMEOUT_S).strip():
            return
    raise GitError(["clean", clean], 1, f"{path} still held files git does not track after three checkouts")


WORKSPACE_TIMEOUT_S = 600.0
"""A checkout or clean of a whole workspace: a large tree on a slow disk."""


class TreeChange(NamedTuple):
    """One path that differs between two commits' trees (``tree_changes``)."""

    status: str
    """git's letter: ``A`` added, ``D`` deleted, ``M`` contents or executable bit changed, ``T`` type changed."""
    old_mode: str
    """Its mode in the first commit, octal as git writes it (``000000`` when absent, ``160000`` a submodule)."""
    new_mode: str
    path: str


def tree_changes(repo: Path, old: str, new: str) -> list[TreeChange]:
    """The files that differ between the trees of commits ``old`` and ``new`` (full ids), every path apart (no
    renames: a rename is a delete and an add). Read from the trees alone (``diff-tree``): the cost follows the
    change, not the tree, and no work tree is looked at.

    Raises:
        GitError: git failed (a commit is missing, say).
    """
    fields = git("diff-tree", "-r", "-z", "--raw", "--no-renames", old, new, cwd=repo).split("\0")
    changes = []
    for header, path in zip(fields[0::2], fields[1::2], strict=False):
        parts = header.lstrip(":").split(" ")
        if len(parts) != 5:
            raise GitError(["diff-tree", old, new], 1, f"unexpected diff-tree output: {header!r}")
        changes.append(TreeChange(status=parts[4], old_mode=parts[0], new_mode=parts[1], path=path))
    return changes


def checkout_paths(work: Path, commit: str, paths: Sequence[str]) -> None:
    """``paths`` of the worktree at ``work`` made as ``commit`` (a full id) has them, in its files and its index:
    written, or removed where ``commit`` has none (``--no-overlay``; a directory left empty goes too). Every
    other file and index entry is untouched (HEAD too). Each path is literal (no glob), handed over on stdin.

    Raises:
        GitError: git failed (a path neither in the index nor in ``commit``, say).
    """
    if not paths:
        return
    git(
        "--literal-pathspecs", "checkout", "--quiet", "--no-overlay", commit, "--pathspec-from-file=-",
        "--pathspec-file-nul", cwd=work, timeout=WORKSPACE_TIMEOUT_S, stdin="\0".join(paths),
    )  # fmt: skip


def _recycled(
    bare: Path,
    path: Path,
    branch: str,
    base: str,
    refs: set[str] | None,
    origin: str | None,
    excludes: tuple[str, ...],
    published: Path | None,
    recycle: Recycle,
) -> None:
    """The released workspace at ``path`` on a new ``branch``: its repository made anew with the trusted index,
    then checked out over the files there (rewriting only what differs, or what its last agent touched) and
    cleaned of everything git does not track, ignored files too: nothing of the earlier bead's stays."""
    from shared.host import repository_renewal  # here: it imports this module

    assert recycle.trusted_index is not None
    start = WorkspaceStart.of(bare, branch, base, refs)
    settled = recycle.settled if not start.branch_in_clone and published is None else None
    if settled is not None and (settled.base, settled.origin, settled.excludes) != (base, origin, excludes):
        settled = None
    if settled is not None and _moved_from_settled(bare, path, branch, base, start, settled):
        return
    seeded = False

    def configure(repo: Path) -> None:
        nonlocal seeded
        seeded = _configured(repo, bare, origin, base, start, excludes, published, branch)

    repository_renewal.renew(
        path, scratch=recycle.scratch, alternates=bare / "objects", trusted_index=recycle.trusted_index,
        owner=recycle.owner, configure=configure,
    )  # fmt: skip
    checkout_clean(path, (branch,) if seeded else ("-B", branch, start.commit), "-ffdx")


def _moved_from_settled(
    bare: Path, path: Path, branch: str, base: str, start: WorkspaceStart, settled: SettledWorkspace
) -> bool:
    """The settled workspace at ``path`` moved to a new ``branch`` at ``start`` by the change alone
    (``tree_moves``); False when it cannot be (a git ran in it since, or the change needs the full pass), with
    nothing or part of it done: the caller then takes the whole way, which makes anything right."""
    from shared.host import tree_moves  # here: it imports this module

    if tree_moves.index_stamp(path / ".git" / "index") != settled.index_stamp:
        return False
    try:
        if not tree_moves.moved(bare, path, settled.commit, start.commit):
            return False
        # One transaction; "create": a new branch, never one moved.
        moves = f"update refs/remotes/origin/{base} {start.base_commit}\ncreate refs/heads/{branch} {start.commit}\n"
        git("update-ref", "--stdin", cwd=path, stdin=moves)
        _point_head(path / ".git", branch)
    except (GitError, UnicodeError):  # UnicodeError: a path git wrote that is not UTF-8
        return False
    return True


def _point_head(git_dir: Path, branch: str) -> None:
    """``git symbolic-ref HEAD refs/heads/<branch>`` without a git process (one less on a session's start): HEAD
    written as git writes it, through ``HEAD.lock`` renamed over it (never through a link), with no reflog entry, as
    ``symbolic-ref`` without ``-m``.

    Raises:
        GitError: the lock is taken (a git runs there) or cannot be written.
    """
    lock = git_dir / "HEAD.lock"
    try:
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise GitError(["symbolic-ref", "HEAD"], 128, f"cannot lock {lock}: {exc}") from exc
    try:
        with os.fdopen(fd, "w") as out:
            out.write(f"ref: refs/heads/{branch}\n")
        os.replace(lock, git_dir / "HEAD")
    except OSError as exc:
        lock.unlink(missing_ok=True)
        raise GitError(["symbolic-ref", "HEAD"], 128, f"cannot write {git_dir / 'HEAD'}: {exc}") from exc


def settle_released(
    bare: Path, path: Path, base: str, *, origin: str | None, excludes: tuple[str, ...], recycle: Recycle
) -> SettledWorkspace | None:
    """The workspace at ``path``, just released (``release_worktree``) and its session's processes ended, made ready
    for the polecat's next bead while nothing waits for it: what the start would do (its repository made anew with
    the trusted index, ``origin`` and ``excludes``; checked out over the files there; cleaned of everything git does
    not track), at the base as the rig's clone ``bare`` has it now, detached. Where it was left; None when the
    index it wrote cannot be found.

    The next start then moves it by the change alone (``Recycle.settled``), which is sound only where nothing can
    write in it between the two: the caller's to know (agents of the witness's own OS user could, but they could
    as well write in a workspace in use; agents of an OS user of their own share it, so there the start takes the
    whole way).

    Raises:
        GitError: git failed (the next start takes the whole way).
        OSError: the workspace or the trusted index is not what it must be.
    """
    from shared.host import repository_renewal, tree_moves  # here: they import this module

    assert recycle.trusted_index is not None
    tracked = f"refs/remotes/origin/{base}"
    commit = resolve_commit(bare, tracked if _ref_exists(bare, tracked) else base)
    start = WorkspaceStart(commit=commit, base_commit=commit, branch_in_clone=False)

    def configure(repo: Path) -> None:
        _configured(repo, bare, origin, base, start, excludes, None, "")

    repository_renewal.renew(
        path, scratch=recycle.scratch, alternates=bare / "objects", trusted_index=recycle.trusted_index,
        owner=recycle.owner, configure=configure,
    )  # fmt: skip
    checkout_clean(path, ("--detach", commit), "-ffdx")
    stamp = tree_moves.index_stamp(path / ".git" / "index")
    if stamp is None:
        return None
    return SettledWorkspace(commit=commit, index_stamp=stamp, base=base, origin=origin, excludes=excludes)


SEED_MAX_BYTES = 1024 * 1024 * 1024
"""The largest published bundle a workspace made again starts from (the merge queue refuses far smaller ones,
``GT_MR_MAX_BYTES``): a sparse file of an agent's never fills the disk."""


def _seeded(workspace: Path, bundle: Path, branch: str) -> bool:
    """The branch fetched from a bundle its bead published earlier, marked published; False when the bundle does
    not hold it (it is data: fetched, never run). The bundle is in an agent's folder: copied first as a regular
    file, never followed or fetched as a repository (a directory of that name would be one)."""
    seed = workspace / ".git" / "seed.bundle"
    try:
        if not _copy_capped(bundle, seed, SEED_MAX_BYTES):
            return False
        fetched = _succeeds(
            "fetch", "--quiet", "--no-tags", str(seed), f"+refs/heads/{branch}:refs/heads/{branch}", cwd=workspace
        )
    except OSError:
        return False
    finally:
        seed.unlink(missing_ok=True)
    if not fetched:
        return False
    git("update-ref", PUBLISHED_REF, f"refs/heads/{branch}", cwd=workspace)
    return True


def _copy_capped(source_path: Path, dest: Path, cap: int) -> bool:
    """Copy the regular file ``source_path`` (``safe_files.open_regular``) to ``dest``; False when it is over
    ``cap`` bytes (checked before and while copying: it may grow meanwhile)."""
    with safe_files.open_regular(source_path) as source:
        if os.fstat(source.fileno()).st_size > cap:
            return False
        with dest.open("wb") as copy:
            while chunk := source.read(min(1 << 20, cap + 1 - copy.tell())):
                copy.write(chunk)
            return copy.tell() <= cap


def workspace_branch(path: Path) -> str | None:
    """The branch a workspace (or an older version's worktree) has checked out, read from its ``HEAD`` file
    without running git in it; None when it is no repository or not on a branch."""
    # Read without following a link or waiting on a FIFO the workspace's agent put there (``safe_files``).
    dot_git = path / ".git"
    try:
        if dot_git.is_file():  # a worktree of an older version (the witness's own user's): ``.git`` names its git dir
            text = safe_files.read_regular(dot_git, cap=4096).decode(errors="replace").strip()
            if not text.startswith("gitdir: "):
                return None
            raw = safe_files.read_regular(Path(text[len("gitdir: ") :]) / "HEAD", cap=512)
        else:
            raw = safe_files.read_beneath(path, ".git/HEAD", cap=512)
    except OSError:
        return None
    first = raw.decode(errors="replace").strip()
    prefix = "ref: refs/heads/"
    return first[len(prefix) :] if first.startswith(prefix) else None


def worktree_refs(branch: str, base: str) -> tuple[str, str]:
    """The refs ``ensure_worktree`` looks at in the rig's clone: the branch's (made there by an older version's
    worktrees), and origin's base as the clone last fetched it."""
    return f"refs/heads/{branch}", f"refs/remotes/origin/{base}"


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
    """What a workspace holds that would be lost if it were removed: uncommitted changes, and commits that are
    neither on the base branch (as it last fetched it) nor published by `gt done` (``PUBLISHED_REF``; an older
    version's worktree: pushed, ``refs/remotes/origin/<branch>``)."""
    if not (path / ".git").exists():
        return WorktreeState(exists=False)
    branch = git("rev-parse", "--abbrev-ref", "HEAD", cwd=path).strip()
    head = git("rev-parse", "HEAD", cwd=path).strip()
    changes = status_paths(path)
    saved = [
        ref
        for ref in (PUBLISHED_REF, f"refs/remotes/origin/{branch}", f"refs/remotes/origin/{base}")
        if _ref_exists(path, ref)
    ] or [base]
    excluded = [f"^{ref}" for ref in saved]
    unpushed = int(git("rev-list", "--count", "HEAD", *excluded, cwd=path).strip() or 0)
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


def exclude_from_git(worktree: Path, patterns: tuple[str, ...], *, owner: tuple[int, int] | None = None) -> None:
    """List ``patterns`` in the workspace's ``.git/info/exclude`` (local, never committed): git status stays clean,
    so ``gt done`` and the workspace's clean-up do not take them for unsaved work. Idempotent: only the patterns
    not listed yet are appended. The workspace is the agent's: the file is found below it (never where its git
    says, which its ``.git`` file could point anywhere) and written without following a link; ``owner`` (uid,
    gid) is given a file made."""
    if not patterns:
        return
    if (worktree / ".git").is_file() and not (worktree / ".git").is_symlink():
        # A worktree of an older version (its git dir in the witness's clone, the witness's own user's): as before.
        exclude = Path(git("rev-parse", "--git-path", "info/exclude", cwd=worktree).strip())
        _list_in(exclude if exclude.is_absolute() else worktree / exclude, patterns)
        return
    safe_files.add_lines_beneath(worktree, ".git/info/exclude", patterns, owner=owner)


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


def publish(path: Path, branch: str, base: str, folder: Path) -> Published:
    """Write ``branch`` of the workspace at ``path`` as a bundle for the merge queue (`gt done`): its commits
    that the base branch (as the workspace last fetched it) does not have, as ``folder/<head>.bundle`` (outside
    the workspace: it outlives the workspace until the refinery took it); ``PUBLISHED_REF`` then marks them
    published. A branch with nothing new carries its head commit alone.

    Raises:
        GitError: git could not read the branch or write the bundle.
    """
    head = git("rev-parse", "--verify", "--end-of-options", f"refs/heads/{branch}^{{commit}}", cwd=path).strip()
    tracked = f"refs/remotes/origin/{base}"
    excluded = [f"^{tracked}"] if _ref_exists(path, tracked) else []
    if not excluded or not git("rev-list", "--max-count=1", f"refs/heads/{branch}", *excluded, cwd=path).strip():
        parents = git("rev-list", "--parents", "-n", "1", head, cwd=path).split()[1:]
        excluded = [f"^{parent}" for parent in parents]
    folder.mkdir(parents=True, exist_ok=True)
    bundle = folder / f"{head}.bundle"
    temp = folder / f".{head}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        git("bundle", "create", "--quiet", str(temp), f"refs/heads/{branch}", *excluded, cwd=path)
        temp.replace(bundle)
    finally:
        temp.unlink(missing_ok=True)
    git("update-ref", PUBLISHED_REF, head, cwd=path)
    return Published(head=head, bundle=bundle.resolve())


def import_bundle(
    bare: Path, source: Path, branch: str, head: str, *, target: str, max_bytes: int, scratch: Path
) -> BundleProblem | None:
    """Take the commits a polecat published (``source``, a bundle `gt done` wrote) into the rig's clone ``bare``
    as ``imported_ref(target, head)``; None when done, else why not. The file is data from an agent: copied first
    (a regular file, not followed through a link, at most ``max_bytes``), checked (its prerequisites are in the
    clone, fetched from origin when not; its ``branch`` is at ``head``, the commit the merge request names),
    unbundled into a scratch repository of the refinery's own (which borrows the clone's objects), measured (its
    new objects at most ``max_bytes`` once unpacked: a bundle compresses) and fetched from there with git's object
    checks (git 2.39 checks nothing fetched from a bundle itself). Nothing of the agent's repository runs.
    """
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        return BundleProblem("invalid", f"the published bundle {source} cannot be read: {exc.strerror}")
    scratch.mkdir(parents=True, exist_ok=True)
    name = uuid.uuid4().hex
    copy, unpacked = scratch / f"{name}.bundle", scratch / f"{name}.git"
    try:
        with os.fdopen(fd, "rb") as file:
            info = os.fstat(file.fileno())
            if not stat.S_ISREG(info.st_mode):
                return BundleProblem("invalid", f"the published bundle {source} is not a regular file")
            if info.st_size > max_bytes:
                return BundleProblem("too_large", _too_large(info.st_size, max_bytes))
            with open(copy, "wb") as out:
                out.write(file.read(max_bytes + 1))  # at most one byte over: a file that grew meanwhile
        if copy.stat().st_size > max_bytes:
            return BundleProblem("too_large", _too_large(copy.stat().st_size, max_bytes))
        if not _succeeds("bundle", "verify", "--quiet", str(copy), cwd=bare):
            fetch(bare)  # its base may be newer than the clone's last fetch
            if not _succeeds("bundle", "verify", "--quiet", str(copy), cwd=bare):
                return BundleProblem("invalid", "the published bundle is not a bundle of this rig's history")
        listed = git("bundle", "list-heads", str(copy), cwd=bare).splitlines()
        heads = {ref: commit for commit, _, ref in (line.partition(" ") for line in listed)}
        found = heads.get(f"refs/heads/{branch}")
        if found != head:
            return BundleProblem(
                "invalid", f"the published bundle has {branch} at {found or 'no commit'}, not the submitted {head}"
            )
        git("init", "--quiet", "--bare", str(unpacked))
        (unpacked / "objects" / "info" / "alternates").write_text(f"{(bare / 'objects').resolve()}\n")
        git("fetch", "--quiet", "--no-tags", str(copy), f"+refs/heads/{branch}:refs/published", cwd=unpacked)
        known = git("for-each-ref", "--format=%(objectname)", "refs/remotes/origin", cwd=bare).split()
        new_objects = git("rev-list", "--objects", "refs/published", "--not", *known, cwd=unpacked).splitlines()
        ids = "".join(line.split(" ", 1)[0] + "\n" for line in new_objects if line)
        sizes = _run(["cat-file", "--batch-check=%(objectsize)"], unpacked, git_environment(), GIT_TIMEOUT_S, ids)
        unpacked_bytes = sum(int(size) for size in sizes.stdout.split() if size.isdigit())
        if unpacked_bytes > max_bytes:
            return BundleProblem("too_large", _too_large(unpacked_bytes, max_bytes, unpacked=True))
        git(
            "-c", "fetch.fsckObjects=true", "fetch", "--quiet", "--no-tags", str(unpacked),
            f"+refs/published:{imported_ref(target, head)}", cwd=bare,
        )  # fmt: skip
    except GitError as exc:
        return BundleProblem("invalid", f"the published bundle could not be imported: {exc.stderr[-500:]}")
    finally:
        copy.unlink(missing_ok=True)
        force_remove(unpacked)
    return None


def _too_large(size: int, max_bytes: int, *, unpacked: bool = False) -> str:
    how = " once unpacked" if unpacked else ""
    return (
        f"the branch adds {size / 1e6:.1f} MB of new objects{how}, over the merge queue's limit of "
        f"{max_bytes / 1e6:.0f} MB "
        "(GT_MR_MAX_BYTES): remove the large files from its commits (history too: a later commit deleting them "
        "still carries them), then gt done again"
    )


def release_worktree(bare: Path, path: Path, base: str) -> str:
    """A workspace its session gives up, when it holds nothing unsaved: kept where it is for the polecat's next
    bead (``ensure_worktree``'s ``recycle``: moved by what changes, not made again), or removed when it is an older
    version's worktree; what was done.

    Raises:
        WorktreeNotEmptyError: it has uncommitted or unpushed work (it is kept, as it is).
        GitError: an older version's worktree would not go away.
    """
    state = worktree_state(path, base)
    if state.exists and (state.dirty or state.unpushed):
        raise WorktreeNotEmptyError(path, state.dirty, state.unpushed)
    if (path / ".git").is_dir() and not path.is_symlink():
        return "worktree released for the polecat's next bead"
    remove_worktree(bare, path, base)
    return "worktree removed"


def remove_worktree(bare: Path, path: Path, base: str) -> None:
    """Remove a workspace that holds nothing unsaved, and make sure it is gone.

    Raises:
        WorktreeNotEmptyError: it has uncommitted or unpushed work (it is kept).
        GitError: the directory would not go away.
    """
    state = worktree_state(path, base)
    if state.exists and (state.dirty or state.unpushed):
        raise WorktreeNotEmptyError(path, state.dirty, state.unpushed)
    if (path / ".git").is_dir():
        force_remove(path)  # a workspace: a repository of its own
    elif path.exists():
        # A worktree an older version made in the clone: unregistered there too.
        git("worktree", "remove", "--force", str(path), cwd=bare, check=False)
        if path.exists():
            force_remove(path)
        # Not checked: clean-ups of other worktrees may prune at the same moment; what matters is checked next.
        git("worktree", "prune", cwd=bare, check=False)
    if path.exists():
        raise GitError(["worktree", "remove", str(path)], 1, f"{path} is still there after removing it")


def force_remove(path: Path) -> None:
    """Remove a directory tree even where files or directories are read-only, and check it is gone. The tree may be
    an agent's, changing while it is removed: never a link followed or a FIFO waited on (``safe_files``); what it
    added meanwhile is taken on a second pass."""
    for _attempt in range(2):
        safe_files.remove_tree(path)
        if not os.path.lexists(path):
            return
    _remove_deep(path)


def _remove_deep(path: Path) -> None:
    """What ``safe_files.remove_tree`` left (a tree deeper than it walks): ``rm -rf`` as the tree's owner (never
    root's rights over another user's tree: that user could remove it anyway), then what is left of the top as
    this process. ``rm`` follows no link."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return
    owner = _owner_of(path) if stat.S_ISDIR(found.st_mode) else None
    prefix = switch_user_argv(*owner) if owner is not None else ()
    subprocess.run(
        [*prefix, "rm", "-rf", "--one-file-system", "--", *(str(child) for child in _children(path))],
        capture_output=True,
        timeout=GIT_TIMEOUT_S,
        check=False,
    )
    safe_files.remove_tree(path)


def _children(path: Path) -> list[Path]:
    try:
        return [path / name for name in os.listdir(path)]
    except OSError:
        return []
