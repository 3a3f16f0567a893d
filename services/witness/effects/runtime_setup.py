"""Readies an agent runtime for one session: finds its binary, writes its config home and first-run state, its
hooks in the worktree (kept out of git), and says what is missing when it cannot run. The I/O half of
``shared.model.runtimes`` (which decides what is written); called by the executor before the tmux pane starts."""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shared.core.decoding import UNDECODABLE
from shared.core.errors import GastownError
from shared.host import git, safe_files
from shared.model.runtimes import (
    AGENT_FAILURE,
    HOOK_LOG,
    HOOK_MARK_SESSION_START,
    START_ANSWER,
    START_ANSWER_TAKEN,
    Runtime,
)

PROJECT_ROOT = Path(__file__).resolve().parents[3]
"""The checkout the witness runs from (its ``.tools/npm`` holds the agent CLIs ``./dev setup`` installed)."""
VERSION_TIMEOUT_S = 30.0


class RuntimeUnavailableError(GastownError):
    """The runtime cannot start here (no binary, no credentials): a person must act, retrying changes nothing."""


@functools.cache
def gt_script() -> str:
    """The path of this installation's ``gt``, which the agents' hooks run: beside the interpreter (a virtualenv, the
    official Python images' ``/usr/local/bin``), else in the interpreter's scripts directory (a distribution's Python
    whose pip installs scripts elsewhere: Debian's is ``/usr/bin/python3``, its pip's scripts ``/usr/local/bin``), else
    the one on ``PATH``."""
    beside = Path(sys.executable).parent / "gt"
    for candidate in (beside, Path(sysconfig.get_path("scripts")) / "gt"):
        if candidate.is_file():
            return str(candidate)
    return shutil.which("gt") or str(beside)


def binary(runtime: Runtime, env: Mapping[str, str]) -> str:
    """The runtime's binary to run, or RuntimeUnavailableError naming where it was looked for."""
    found, places = runtime.find_binary(env, shutil.which, PROJECT_ROOT)
    if found is None:
        raise RuntimeUnavailableError(
            f"the {runtime.binary_name} binary was not found (looked at {places}); install it "
            f"(`npm install -g {runtime.package}`, or `./dev setup` in a checkout) or set {runtime.binary_setting}"
        )
    return found


def check(runtime: Runtime, env: Mapping[str, str]) -> None:
    """Raises RuntimeUnavailableError when ``runtime`` cannot run with the witness's environment ``env``."""
    if runtime.binary_name:
        binary(runtime, env)
    problem = runtime.unavailable(env, logged_in=_logged_in(runtime, env))
    if problem is not None:
        raise RuntimeUnavailableError(problem)


@functools.cache
def binary_version(path: str, package: str = "") -> str:
    """The binary's version (``2.1.332``), once per binary: from the manifest of npm package ``package`` when the
    binary is that package's (a file read: ``--version`` starts the whole CLI, seconds for OpenCode on a busy
    machine, and the first session of every witness waited on it), else from its ``--version`` (``2.1.332 (Claude
    Code)`` gives ``2.1.332``); empty when it cannot tell (the first-run state then leaves the version out)."""
    return _package_version(path, package) or _version_output(path)


PACKAGE_DEPTH = 3
"""How far above the binary (its real path) its package's root may be: ``bin/``, ``bundle/``."""


def _package_version(path: str, package: str) -> str:
    if not package:
        return ""
    for folder in Path(path).resolve().parents[:PACKAGE_DEPTH]:
        try:
            manifest = json.loads((folder / "package.json").read_text())
        except OSError:
            continue  # no manifest here: further up
        except UNDECODABLE:
            continue
        if isinstance(manifest, dict) and manifest.get("name") == package:
            version = manifest.get("version")
            return version if isinstance(version, str) else ""
    return ""


def _version_output(path: str) -> str:
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=VERSION_TIMEOUT_S, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    words = [word for word in out.split() if word[:1].isdigit()]
    return words[0] if words else ""


def _logged_in(runtime: Runtime, env: Mapping[str, str]) -> bool:
    files = runtime.login_files(env)
    return bool(files) and all(Path(source).is_file() for source, _ in files)


def prepare(
    runtime: Runtime,
    *,
    worktree: Path,
    session_dir: Path,
    env: Mapping[str, str],
    as_root: bool,
    owner: tuple[int, int] | None = None,
    gt: str = "",
) -> tuple[str, dict[str, str]]:
    """Ready a runtime for a session in ``worktree``: its config home under ``session_dir`` with its first-run
    state and any login's credentials, its files in the worktree (excluded from git); returns the binary and the
    environment it adds. ``as_root``: the agent runs as root (not as ``GT_AGENT_USER``); ``owner``: (uid, gid) of
    that user, given what is written; ``gt``: what its hooks run (default: the ``gt`` beside this interpreter; the
    benchmark's bare ceiling gives ``true``)."""
    found = binary(runtime, env) if runtime.binary_name else ""
    session_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    (session_dir / HOOK_MARK_SESSION_START).unlink(missing_ok=True)  # only this start's hook counts
    (session_dir / AGENT_FAILURE).unlink(missing_ok=True)  # and only this start's failures
    for answer in (START_ANSWER, START_ANSWER_TAKEN):  # written for this start once it started
        (session_dir / answer).unlink(missing_ok=True)
    added = runtime.env(env, session_dir=str(session_dir), root=as_root)
    gt = gt or gt_script()
    # The runtime dir and the workspace may be the agent's (GT_AGENT_USER; a workspace used before): written
    # below them without following a link it put there, and given to ``owner``.
    version = binary_version(found, runtime.package) if found and runtime.wants_version else ""
    for file in runtime.files(worktree=str(worktree), env=env, version=version, gt=gt):
        safe_files.write_beneath(
            worktree if file.in_worktree else session_dir, file.path, file.content, mode=file.mode, owner=owner
        )
    for source, destination in runtime.login_files(env):
        if Path(source).is_file():
            safe_files.write_beneath(session_dir, destination, Path(source).read_text(), owner=owner)
    if runtime.git_excludes():
        git.exclude_from_git(worktree, runtime.git_excludes(), owner=owner)
    return found, added


def started(session_dir: Path) -> bool:
    """The session's SessionStart hook ran (it leaves its mark in the session's runtime dir)."""
    return (session_dir / HOOK_MARK_SESSION_START).exists()


def last_activity(session_dir: Path, patterns: tuple[str, ...]) -> datetime | None:
    """The newest mtime of the files matching ``patterns`` (globs relative to ``session_dir``): the agent's last
    activity its runtime left on disk (a tool-call hook's mark, a transcript); None when there is none."""
    newest = 0.0
    for pattern in patterns:
        for path in session_dir.glob(pattern):
            try:
                newest = max(newest, path.stat().st_mtime)
            except OSError:
                continue  # gone in between
    return datetime.fromtimestamp(newest, UTC) if newest > 0 else None


def agent_failure(session_dir: Path) -> dict[str, Any] | None:
    """The newest turn failure the session's agent recorded (its StopFailure hook), or None."""
    try:
        data = json.loads(safe_files.read_regular(session_dir / AGENT_FAILURE))
    except OSError:
        return None
    except UNDECODABLE:  # the agent writes it: a nesting deep enough to exhaust the stack included
        return None
    return data if isinstance(data, dict) else None


def hook_log(session_dir: Path) -> str:
    """The session's hook log (one line per hook its agent fired), or '' when there is none."""
    try:
        return safe_files.read_regular(session_dir / HOOK_LOG).decode(errors="replace")
    except OSError:
        return ""
