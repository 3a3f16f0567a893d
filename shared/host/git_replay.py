"""A branch's commits replayed onto another commit without a work tree: what ``git rebase`` does, in the object
database alone, so its cost follows the change, never the size of the tree.

git 2.39 has ``merge-tree --write-tree`` but not its ``--merge-base``: each commit ``C`` (parent ``P``) is picked
onto the tip ``T`` by merging ``C`` with a throwaway commit that has ``T``'s tree and ``P`` as its only parent, so
their merge base is ``P`` and the merge is exactly the cherry-pick (base ``P``, ours ``T``, theirs ``C``).

Semantics are ``git rebase --reapply-cherry-picks --empty=drop``: every commit of ``onto..head`` that is no merge
is replayed in order (also one whose patch ``onto`` has: a fix equal to another branch's fix must not be dropped
while the commit it fixes is kept); a commit that becomes empty is dropped, one that was empty to start is kept;
a commit whose parent is the tip already is kept as it is (a branch on top of ``onto`` comes out unchanged, its
commits' ids too); others keep their author and message, the committer is the service's. Adapter: runs git.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import NamedTuple

from shared.host import git

_AUTHOR = re.compile(rb"^author (?P<name>.*?) <(?P<email>.*)> (?P<date>\d+ [+-]\d{4})$")


class Replayed(NamedTuple):
    """What ``replay`` came to: the new tip, or None and the conflicting paths."""

    tip: str | None
    conflicts: list[str]


class _Commit(NamedTuple):
    tree: str
    parents: list[str]
    author: dict[str, str]
    message: bytes


def replay(repo: Path, head: str, onto: str) -> Replayed:
    """``head``'s own commits (those ``onto`` does not reach, merges left out) replayed onto ``onto`` in the bare
    repository ``repo``: the new tip (``onto`` itself when every commit came out empty), or (None, the paths that
    conflict at the first commit that does not apply). ``head`` and ``onto`` are read as names, never options.

    Raises:
        GitError: a name names no commit, or git failed otherwise.
    """
    head, onto = git.resolve_commit(repo, head), git.resolve_commit(repo, onto)
    commits = _run(repo, "rev-list", "--reverse", "--topo-order", "--no-merges", head, f"^{onto}").split()
    tip, tip_tree = onto, _tree(repo, onto)
    for commit in commits:
        picked = _read(repo, commit)
        parent = picked.parents[0] if picked.parents else None
        if parent == tip and len(picked.parents) == 1:
            tip, tip_tree = commit, picked.tree  # already on the tip: kept as it is, as rebase fast-forwards it
            continue
        started_empty = picked.tree == (_tree(repo, parent) if parent else _EMPTY_TREE)
        if started_empty:
            new_tree = tip_tree
        else:
            merged, conflicts = _pick(repo, commit, parent, tip_tree)
            if merged is None:
                return Replayed(None, conflicts)
            if merged == tip_tree:
                continue  # its change is on the tip already: dropped, as --empty=drop does
            new_tree = merged
        tip = _commit_tree(repo, new_tree, tip, picked)
        tip_tree = new_tree
    return Replayed(tip, [])


_EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"


def _pick(repo: Path, commit: str, parent: str | None, onto_tree: str) -> tuple[str | None, list[str]]:
    """The tree of ``commit``'s change applied to ``onto_tree`` (base: ``parent``), or None and the conflicts."""
    ours = _run(repo, "commit-tree", onto_tree, *(("-p", parent) if parent else ()), stdin=b"replay base\n").strip()
    done = _git(
        repo, "merge-tree", "--write-tree", "--name-only", "--no-messages", "-z",
        *(() if parent else ("--allow-unrelated-histories",)), ours, commit,
    )  # fmt: skip
    fields = [field.decode(errors="replace") for field in done.stdout.split(b"\0") if field]
    if done.returncode == 0 and fields:
        return fields[0], []
    if done.returncode == 1 and fields:
        return None, list(dict.fromkeys(fields[1:]))
    raise git.GitError(["merge-tree", ours, commit], done.returncode, done.stderr.decode(errors="replace"))


def _read(repo: Path, commit: str) -> _Commit:
    raw = _git(repo, "cat-file", "commit", commit, check=True).stdout
    header, _, message = raw.partition(b"\n\n")
    tree, parents, author = "", [], {}
    for line in header.split(b"\n"):
        if line.startswith(b"tree "):
            tree = line[5:].decode()
        elif line.startswith(b"parent "):
            parents.append(line[7:].decode())
        elif found := _AUTHOR.match(line):
            author = {
                "GIT_AUTHOR_NAME": found["name"].decode(errors="replace"),
                "GIT_AUTHOR_EMAIL": found["email"].decode(errors="replace"),
                "GIT_AUTHOR_DATE": found["date"].decode(),
            }
    return _Commit(tree=tree, parents=parents, author=author, message=message)


def _commit_tree(repo: Path, tree: str, parent: str, picked: _Commit) -> str:
    return _run(repo, "commit-tree", tree, "-p", parent, stdin=picked.message, env=picked.author).strip()


def _tree(repo: Path, commit: str) -> str:
    return _run(repo, "rev-parse", "--verify", "--end-of-options", f"{commit}^{{tree}}").strip()


def _run(repo: Path, *args: str, stdin: bytes | None = None, env: dict[str, str] | None = None) -> str:
    return _git(repo, *args, stdin=stdin, env=env, check=True).stdout.decode()


def _git(
    repo: Path, *args: str, stdin: bytes | None = None, env: dict[str, str] | None = None, check: bool = False
) -> subprocess.CompletedProcess[bytes]:
    """git in ``repo`` (a service's own repository: never another user's), bytes in and out (a commit message is
    any bytes)."""
    try:
        environment = git.git_environment(None, **(env or {}))
    except ValueError as exc:
        raise git.GitError(list(args), -1, str(exc)) from exc
    try:
        done = subprocess.run(
            ["git", *git.GIT_SAFE_CONFIG, *args],
            cwd=repo,
            env=environment,
            input=stdin if stdin is not None else b"",
            capture_output=True,
            timeout=git.GIT_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise git.GitError(list(args), -1, f"timed out after {git.GIT_TIMEOUT_S}s") from exc
    if check and done.returncode != 0:
        raise git.GitError(list(args), done.returncode, done.stderr.decode(errors="replace"))
    return done
